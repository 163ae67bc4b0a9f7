//! Allocator settings for the binaries, which use mimalloc as the global allocator.
//!
//! Training and sampling allocate and free large tensors at a high rate. glibc's malloc maps and
//! unmaps each one (page faults and zeroing every time); mimalloc reuses freed memory, but by
//! default returns it to the OS ("purges") 10 ms after it is freed, so the next step's tensors
//! fault their pages in again: measured on the tiny LoRA benchmark, zeroing fresh pages was a
//! quarter of the time and a 10 s purge delay made a step 2.4x faster. Memory that stays unused
//! for 10 s still goes back.
//!
//! The process also runs without transparent huge pages. mimalloc asks for them on its arenas
//! (`MADV_HUGEPAGE`), and where the kernel then compacts memory on a fault (`defrag = madvise`,
//! a common default) and the allocator's purges split huge pages that come back whole, every
//! such fault zeroes 2 MiB in the kernel. Measured on 2 cores (AMD EPYC): a LoRA step of
//! SmolLM2-135M went from 131 to 152 tokens/s (28.8 s of kernel time to 4.5 s for the whole
//! benchmark), the tiny model's from 8,800-9,000 to 9,900-11,000, and compiling a 12 MB
//! JavaScript plugin from 39-51 s of CPU to 32 s.

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory for 10 s before returning it to the OS, and turns transparent huge pages
/// off for this process and the processes it starts. Call at the start of `main`; the first
/// setting only has an effect when mimalloc is the global allocator.
pub fn configure_memory() {
    // SAFETY: setting an option is a plain store in mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
    // SAFETY: a plain system call with integer arguments. Best effort: a kernel without the
    // setting runs as before.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}
