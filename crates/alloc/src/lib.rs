//! cellrate-alloc: the global allocator of cellrate's binary and of its benchmarks' servers
//! (so that a floor and cellrate allocate alike).
//!
//! [`MiMalloc`] is mimalloc, reached through its plain entry points (`mi_malloc`,
//! `mi_zalloc`, `mi_realloc`) whenever the layout asks for no more than a machine word's
//! alignment, and through the aligned ones otherwise. The `mimalloc` crate always takes the
//! aligned ones. Their fast path needs a free block already in the size class's list; when
//! the list must first be refilled (every time a block is freed and another of its size
//! taken, as a request's buffers are), mimalloc v3 serves any block whose size is not a
//! power of two by over-allocating on its slow path: about 130 instructions instead of 20,
//! twice per `CL.THROTTLE` (BENCHMARKS.md, #62).
//!
//! Why a plain block is aligned enough: mimalloc's size classes are whole words
//! (`_mi_wsize_from_size`), and a page's first block is aligned to at least 16 bytes
//! (`MI_PAGE_MIN_START_BLOCK_ALIGN`), so every block it hands out is word-aligned. Debug
//! padding and guard pages, which could change that, are only in mimalloc's debug and
//! secure builds, which this crate does not turn on.
//!
//! ```text
//! lib.rs    MiMalloc, the GlobalAlloc
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as ffi;

/// The largest alignment every mimalloc block has: a machine word.
pub const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator, its plain entry points for word-aligned layouts.
///
/// ```
/// #[global_allocator]
/// static GLOBAL: cellrate_alloc::MiMalloc = cellrate_alloc::MiMalloc;
/// let v: Vec<u64> = (0..100).collect();
/// assert_eq!(v.as_ptr() as usize % 8, 0);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MiMalloc;

/// Whether a plain mimalloc block satisfies `align`.
fn plain(align: usize) -> bool {
    align <= PLAIN_ALIGN
}

// SAFETY: every pointer returned comes from mimalloc with at least the layout's size and
// alignment (plain blocks are word-aligned, see the crate's docs; larger alignments go to
// the aligned entry points), and every pointer freed or reallocated came from this
// allocator, as GlobalAlloc's contract guarantees.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align()) {
            // SAFETY: mi_malloc takes any size; its blocks are word-aligned.
            unsafe { ffi::mi_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: a Layout's alignment is a power of two, as mi_malloc_aligned requires.
            unsafe { ffi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align()) {
            // SAFETY: as alloc, zeroed.
            unsafe { ffi::mi_zalloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: as alloc, zeroed.
            unsafe { ffi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8 }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract); mi_free frees
        // plain and aligned blocks alike.
        unsafe { ffi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(layout.align()) {
            // SAFETY: `ptr` came from this allocator; a block mi_realloc returns is a
            // plain, word-aligned one.
            unsafe { ffi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8 }
        } else {
            // SAFETY: as above, keeping the layout's alignment.
            unsafe {
                ffi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size class of the small and medium pages, at every alignment up to 4 KiB,
    /// allocated, zeroed, grown and freed in the order a request's buffers are: each block
    /// has its layout's alignment, zeroed ones are zero, and growing keeps the contents.
    #[test]
    fn every_block_has_its_layouts_alignment() {
        let a = MiMalloc;
        let mut sizes: Vec<usize> = (1..=1024).collect();
        sizes.extend([4095, 4096, 8191, 65_536, 70_000, 1 << 20, (1 << 20) + 8]);
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for &size in &sizes {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                // SAFETY: a non-zero size; every pointer is freed once, with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    p.write_bytes(0xA5, size);
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size}, align {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    let grown = a.realloc(p, layout, size * 2 + 8);
                    assert_eq!(
                        grown as usize % align,
                        0,
                        "grown: size {size}, align {align}"
                    );
                    assert!((0..size).all(|i| *grown.add(i) == 0xA5));
                    a.dealloc(z, layout);
                    let grown_layout =
                        Layout::from_size_align(size * 2 + 8, align).expect("a layout");
                    a.dealloc(grown, grown_layout);
                }
            }
        }
    }

    #[test]
    fn only_word_alignments_take_the_plain_entry_points() {
        assert!(plain(1) && plain(8));
        assert!(!plain(16) && !plain(64));
    }
}
