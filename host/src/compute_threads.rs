//! The number of compute threads, fixed once when a binary starts.
//!
//! candle asks for it before every matrix product (`candle_core::utils::get_num_threads`), and
//! unless `RAYON_NUM_THREADS` is set it works it out again each time by reading and parsing
//! `/proc/cpuinfo`: measured on the tiny model, that was two thirds of a one-datum training step
//! (11.4 ms -> 3.6 ms with the variable set) and a third of a 128-token one (33 -> 21 ms), and
//! `/proc/cpuinfo` grows with the machine's cores. Setting the variable once, to the count candle
//! would have worked out (the physical cores), makes each ask a lookup.

/// Set `RAYON_NUM_THREADS` to the machine's physical cores unless it is set already (which
/// also sizes rayon's global pool, as candle's own pool is sized).
///
/// # Safety
/// Changes the process environment: call it first thing in `main`, while no other thread
/// exists that could read or write the environment at the same time.
pub unsafe fn fix_compute_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = num_cpus::get_physical().max(1);
        // SAFETY: the caller guarantees no other thread touches the environment now.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", cores.to_string()) };
    }
}
