//! Allocator settings for the binaries, which use mimalloc as the global allocator.
//!
//! Training and sampling allocate and free large tensors at a high rate. glibc's malloc maps and
//! unmaps each one (page faults and zeroing every time); mimalloc reuses freed memory, but by
//! default returns it to the OS ("purges") 10 ms after it is freed, so the next step's tensors
//! fault their pages in again: measured on the tiny LoRA benchmark, zeroing fresh pages was a
//! quarter of the time and a 10 s purge delay made a step 2.4x faster. Memory that stays unused
//! for 10 s still goes back.

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h`; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep freed memory for 10 s before returning it to the OS. Call at the start of `main`; it
/// only has an effect when mimalloc is the global allocator.
pub fn keep_freed_memory() {
    // SAFETY: setting an option is a plain store in mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}
