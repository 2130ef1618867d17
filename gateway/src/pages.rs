//! Page-granular memory for the gateway binary: the global allocator that
//! gives every large block (each TCP flow's two smoltcp rings, the guest
//! read buffer, the output batch) its own page-aligned anonymous mapping,
//! and [`release`], which hands the whole pages of an unused buffer back to
//! the kernel.
//!
//! Why: a flow's rings are mostly idle, and an idle ring should cost no
//! resident memory. glibc's own mmap'd chunks put a 16-byte header at the
//! start of the mapping, so every buffer kept at least one page resident
//! (two per flow, ~8 KB, before a byte moved: 10,000 flows were ~100 MB).
//! Here a block is the mapping itself: a page is resident only once data
//! has touched it, and [`release`] can drop it again.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;

/// Blocks of this size or more (with alignment up to [`HEADER`]) get their
/// own mapping; smaller ones are glibc's.
const LARGE: usize = 64 * 1024;
const PAGE: usize = 4096;
/// The room a fallback block keeps before the pointer it returns (it holds
/// the offset back to glibc's block) and the largest alignment handled.
const HEADER: usize = 16;

/// The global allocator: large blocks are mappings of their own, everything
/// else is the system allocator's.
///
/// A large block whose `mmap` fails (e.g. `vm.max_map_count` reached) comes
/// from the system allocator instead, shifted so that it is never page
/// aligned: the address alone says how to free it (page aligned: `munmap`).
#[derive(Debug)]
pub(crate) struct PageAlloc;

fn is_large(layout: Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= HEADER
}

fn round_to_pages(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A fresh anonymous mapping of `size` bytes (zeroed, nothing resident), or null.
fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choice touches no existing memory; failure is reported as MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            round_to_pages(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// The fallback for a large block: `size + 2 * HEADER` bytes from the
/// system allocator, the returned pointer `HEADER` or `2 * HEADER` past its
/// start (whichever is not page aligned), the shift (in units of
/// `HEADER`) stored in the byte before it.
///
/// # Safety
/// As `GlobalAlloc::alloc`.
unsafe fn fallback_alloc(size: usize, zeroed: bool) -> *mut u8 {
    let Ok(outer) = Layout::from_size_align(size + 2 * HEADER, HEADER) else {
        return ptr::null_mut();
    };
    // SAFETY: `outer` has a non-zero size.
    let base = unsafe {
        if zeroed {
            System.alloc_zeroed(outer)
        } else {
            System.alloc(outer)
        }
    };
    if base.is_null() {
        return base;
    }
    let units: u8 = if (base as usize + HEADER).is_multiple_of(PAGE) {
        2
    } else {
        1
    };
    let shift = usize::from(units) * HEADER;
    // SAFETY: `shift <= 2 * HEADER`, inside the block; the byte before the
    // returned pointer is in the block's first `shift` bytes.
    unsafe {
        let p = base.add(shift);
        *p.sub(1) = units;
        p
    }
}

/// # Safety
/// `p` was returned by [`fallback_alloc`] for `size` and not freed.
unsafe fn fallback_dealloc(p: *mut u8, size: usize) {
    // SAFETY: the caller's contract: the shift byte precedes `p` in the
    // block, and the block's layout is the one `fallback_alloc` used.
    unsafe {
        let shift = usize::from(*p.sub(1)) * HEADER;
        let outer = Layout::from_size_align_unchecked(size + 2 * HEADER, HEADER);
        System.dealloc(p.sub(shift), outer);
    }
}

// SAFETY: every block handed out is either the system allocator's (small
// layouts, returned to it unchanged) or, for a large layout, a fresh
// mapping of at least `size` bytes (page aligned, so aligned for any
// `align <= HEADER`) or a fallback block (never page aligned, aligned to
// HEADER); `dealloc` and `realloc` tell the two apart by the address.
unsafe impl GlobalAlloc for PageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !is_large(layout) {
            // SAFETY: forwarded with the caller's contract.
            return unsafe { System.alloc(layout) };
        }
        let p = map(layout.size());
        if p.is_null() {
            // SAFETY: as `alloc`.
            unsafe { fallback_alloc(layout.size(), false) }
        } else {
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !is_large(layout) {
            // SAFETY: forwarded with the caller's contract.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // A fresh mapping reads as zeros without a page being touched.
        let p = map(layout.size());
        if p.is_null() {
            // SAFETY: as `alloc_zeroed`.
            unsafe { fallback_alloc(layout.size(), true) }
        } else {
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if !is_large(layout) {
            // SAFETY: a small block is the system allocator's.
            return unsafe { System.dealloc(p, layout) };
        }
        if (p as usize).is_multiple_of(PAGE) {
            // SAFETY: a page-aligned large block is a mapping of this size
            // made by `map`; nothing refers to it any more.
            unsafe { libc::munmap(p.cast(), round_to_pages(layout.size())) };
        } else {
            // SAFETY: a large block that is not page aligned is a fallback block.
            unsafe { fallback_dealloc(p, layout.size()) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is a
        // valid layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (is_large(layout), is_large(new_layout)) {
            // SAFETY: a small block stays the system allocator's.
            (false, false) => return unsafe { System.realloc(p, layout, new_size) },
            (true, true) if (p as usize).is_multiple_of(PAGE) => {
                // SAFETY: `p` is a mapping of `layout.size()` bytes (rounded
                // to pages) made by `map`; MREMAP_MAYMOVE keeps its contents.
                let q = unsafe {
                    libc::mremap(
                        p.cast(),
                        round_to_pages(layout.size()),
                        round_to_pages(new_size),
                        libc::MREMAP_MAYMOVE,
                    )
                };
                if q != libc::MAP_FAILED {
                    return q.cast();
                }
            }
            _ => {}
        }
        // Across the size boundary, or a fallback block, or mremap failed:
        // a new block, a copy, the old block freed.
        // SAFETY: `new_layout` is valid (above) and non-zero (large or realloc's contract).
        let q = unsafe { self.alloc(new_layout) };
        if !q.is_null() {
            // SAFETY: both blocks hold at least the copied length and are distinct.
            unsafe {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
        }
        q
    }
}

/// Gives the pages wholly inside `buf` back to the kernel: they read as
/// zeros afterwards and cost no resident memory until written again. The
/// bytes at either end that share a page with other memory are left as they
/// are. Best effort: if the kernel refuses, nothing changes.
pub(crate) fn release(buf: &mut [u8]) {
    let start = (buf.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (buf.as_ptr() as usize + buf.len()) / PAGE * PAGE;
    if end <= start {
        return;
    }
    // SAFETY: [start, end) lies inside `buf`, which this function borrows
    // exclusively, so no other reference sees the change. MADV_DONTNEED
    // on the private memory a `&mut [u8]` lives in (heap, mapping, stack)
    // only replaces its bytes (by zeros, or a file's original bytes), and
    // every byte value is a valid u8.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
    }
}

/// Unmaps (from this process's page tables only) the read-only file pages
/// of the program and its libraries: the code and read-only data of every
/// loadable segment without write permission. Called once start-up is
/// over: start-up code (argument parsing, policy compilation, the jail,
/// TLS set-up) is spread over the binary, and the kernel maps 64 KiB
/// around each page touched (fault-around), so an idle gateway kept ~4.5 MB
/// of text it no longer runs counted in its RSS. What the idle loop runs
/// is mapped again on its next fault from the page cache; nothing is read
/// from disk that is still cached, and no byte changes: a private file
/// mapping that was never written reads back as the file.
pub(crate) fn unmap_startup_text() {
    // SAFETY: `dl_iterate_phdr` calls `each` once per loaded object with a
    // valid `dl_phdr_info` for the duration of the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each_object), ptr::null_mut());
    }
}

/// `dl_iterate_phdr`'s callback: drops the pages of `info`'s read-only
/// loadable segments.
unsafe extern "C" fn each_object(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    _data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: glibc passes a valid, live `dl_phdr_info` (see the caller).
    let Some(info) = (unsafe { info.as_ref() }) else {
        return 0;
    };
    // The vDSO is the kernel's mapping, not a file's.
    // SAFETY: `dlpi_name` is null or a NUL-terminated string glibc owns.
    if !info.dlpi_name.is_null()
        && unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_bytes()
            .starts_with(b"linux-vdso")
    {
        return 0;
    }
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers of the
    // object, which stay mapped while it is loaded (all of ours are).
    let headers =
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    for h in headers {
        if h.p_type != libc::PT_LOAD || h.p_flags & libc::PF_W != 0 {
            continue;
        }
        let (Ok(base), Ok(vaddr), Ok(len)) = (
            usize::try_from(info.dlpi_addr),
            usize::try_from(h.p_vaddr),
            usize::try_from(h.p_memsz),
        ) else {
            continue;
        };
        let begin = base.wrapping_add(vaddr);
        // Whole pages inside the segment only: a page shared with a
        // writable neighbour is never touched.
        let start = begin.next_multiple_of(PAGE);
        let end = begin.wrapping_add(len) / PAGE * PAGE;
        if end <= start {
            continue;
        }
        // SAFETY: [start, end) is inside a segment mapped without write
        // permission and never written (PT_LOAD without PF_W: no
        // relocations are applied there), so MADV_DONTNEED only drops
        // page-table entries; the next access maps the same file bytes
        // again. No Rust reference can observe a difference.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_page_aligned_mappings_and_roundtrip() {
        let a = PageAlloc;
        let l = Layout::from_size_align(LARGE + 1, 1).unwrap();
        // SAFETY: the blocks are used within their layouts and freed once.
        unsafe {
            let p = a.alloc_zeroed(l);
            assert!(!p.is_null());
            assert!((p as usize).is_multiple_of(PAGE));
            assert_eq!(*p.add(LARGE), 0);
            *p.add(LARGE) = 7;
            let q = a.realloc(p, l, 4 * LARGE);
            assert_eq!(*q.add(LARGE), 7);
            let l4 = Layout::from_size_align(4 * LARGE, 1).unwrap();
            let r = a.realloc(q, l4, 100);
            assert_eq!(*r.add(50), 0);
            a.dealloc(r, Layout::from_size_align(100, 1).unwrap());
        }
    }

    #[test]
    fn fallback_blocks_are_never_page_aligned() {
        for _ in 0..64 {
            // SAFETY: freed once with the size it was made for.
            unsafe {
                let p = fallback_alloc(LARGE, true);
                assert!(!p.is_null());
                assert!(!(p as usize).is_multiple_of(PAGE));
                assert!((p as usize).is_multiple_of(HEADER));
                assert_eq!(*p.add(LARGE - 1), 0);
                fallback_dealloc(p, LARGE);
            }
        }
    }

    #[test]
    fn release_zeroes_whole_pages_only() {
        let mut v = vec![1u8; 8 * PAGE];
        let base = v.as_ptr() as usize;
        release(&mut v[10..8 * PAGE - 10]);
        let first = (base + 10).next_multiple_of(PAGE) - base;
        let last = (base + 8 * PAGE - 10) / PAGE * PAGE - base;
        assert!(last - first >= 6 * PAGE);
        assert!(
            v[..first].iter().all(|b| *b == 1),
            "shares a page with bytes outside"
        );
        assert!(v[first..last].iter().all(|b| *b == 0));
        assert!(v[last..].iter().all(|b| *b == 1));
    }
}
