//! Cache hints for loops that know their next memory accesses ahead of time
//! (`weir replay` reads the next record before deciding this one). This
//! module owns the one `unsafe` block the hint needs; nothing else.

/// Starts loading the cache lines of `bytes` (up to `MAX_LINES` of them)
/// without waiting for them; a no-op on targets without the hint.
pub fn prefetch<T: ?Sized>(value: &T, bytes: usize) {
    const MAX_LINES: usize = 8;
    let start = std::ptr::from_ref(value).cast::<u8>();
    let bytes = bytes.min(MAX_LINES * 64);
    let mut offset = 0;
    while offset < bytes.max(1) {
        prefetch_line(start.wrapping_add(offset));
        offset += 64;
    }
}

/// Starts loading the cache line at address `at`, which need not be valid.
pub fn prefetch_addr(at: usize) {
    prefetch_line(std::ptr::without_provenance(at));
}

#[allow(unsafe_code)] // the intrinsic is `unsafe` only for its target-feature attribute
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is baseline on x86_64, and a prefetch is a hint: it never
    // faults, whatever the address, and reads nothing into the program.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
