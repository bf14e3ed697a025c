//! Raw, aligned, fixed-size memory shared by the threads of one forward pass: the arena, the
//! KV cache and the per-thread scratch. Allocated once per session; never resized.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Alignment of every allocation and of every arena offset: a cache line, and enough for any
/// SIMD load.
pub const ALIGN: usize = 64;

/// Plain-old-data element types that may be viewed in raw memory (every bit pattern valid).
pub trait Pod: Copy + 'static {}
impl Pod for f32 {}
impl Pod for u8 {}
impl Pod for half::f16 {}

/// Blocks of at least this many bytes are anonymous memory maps rather than heap blocks.
///
/// The allocator zeroes an over-aligned `alloc_zeroed` block by writing it, which makes every
/// page resident at once; fresh anonymous pages are zero without being touched and become
/// resident only when first written. A 2048-position KV cache of which a short chat fills 100
/// rows then costs the process 100 rows of memory, not 45 MiB, and the arena costs the pages
/// the actual ubatch touches.
const MAP_THRESHOLD: usize = 256 * 1024;

/// Where a [`SharedMem`]'s bytes come from.
enum Backing {
    /// A heap block allocated with this layout.
    Heap(Layout),
    /// An anonymous mapping (page-aligned, so also [`ALIGN`]-aligned); unmapped on drop.
    Map(#[allow(dead_code)] memmap2::MmapMut),
}

/// A zero-initialised, 64-byte-aligned block of memory that hands out typed slices by byte
/// offset. Several threads may hold slices at once; keeping them disjoint is the caller's job
/// (see the safety contract of [`SharedMem::slice_mut`]).
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: SharedMem is a plain allocation; all access goes through the unsafe slice methods,
// whose callers guarantee that no two threads hold overlapping slices where one is mutable.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// Allocates `len` zeroed bytes (at least one, so the pointer is always a real allocation).
    /// Large blocks are anonymous maps whose pages become resident as they are written.
    pub fn new(len: usize) -> Result<SharedMem, String> {
        if len >= MAP_THRESHOLD {
            let mut map = memmap2::MmapMut::map_anon(len)
                .map_err(|e| format!("out of memory mapping {len} bytes: {e}"))?;
            // 2 MiB pages where the kernel gives them (transparent huge pages in `madvise`
            // mode, the common default, need the hint): attention reads the KV cache a row at
            // a time, a row or two per 4 KiB page, and with small pages every few rows cost a
            // page walk (SmolLM2 Q8_0 decode at 2,048 tokens of context: 92-105 -> 108-113
            // tok/s, alternating; at none: unchanged).
            // Best effort: pages still become resident only where written, and never past
            // `len`.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            let ptr = NonNull::new(map.as_mut_ptr())
                .ok_or_else(|| format!("out of memory mapping {len} bytes"))?;
            debug_assert_eq!(ptr.as_ptr() as usize % ALIGN, 0, "maps are page-aligned");
            return Ok(SharedMem {
                ptr,
                len,
                backing: Backing::Map(map),
            });
        }
        let layout = Layout::from_size_align(len.max(1), ALIGN)
            .map_err(|e| format!("cannot allocate {len} bytes: {e}"))?;
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            NonNull::new(raw).ok_or_else(|| format!("out of memory allocating {len} bytes"))?;
        Ok(SharedMem {
            ptr,
            len,
            backing: Backing::Heap(layout),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check<T>(&self, byte_offset: usize, n: usize) -> *mut T {
        let bytes = n
            .checked_mul(std::mem::size_of::<T>())
            .expect("slice size overflows");
        let end = byte_offset.checked_add(bytes).expect("slice end overflows");
        assert!(
            end <= self.len,
            "slice {byte_offset}..{end} outside memory of {} bytes",
            self.len
        );
        assert!(
            byte_offset.is_multiple_of(std::mem::align_of::<T>()),
            "misaligned slice at {byte_offset}"
        );
        // SAFETY: byte_offset <= len, inside the allocation.
        unsafe { self.ptr.as_ptr().add(byte_offset).cast::<T>() }
    }

    /// The whole block as bytes, for exclusive (single-threaded) work such as moving KV cache
    /// rows: `&mut self` proves that no other slice of it is alive.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `len` initialised bytes, and `&mut self` excludes every
        // other view (all views borrow `self`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A shared view of `n` elements at `byte_offset`.
    ///
    /// # Safety
    /// No thread may hold a mutable slice overlapping this range while the returned slice lives.
    pub unsafe fn slice<T: Pod>(&self, byte_offset: usize, n: usize) -> &[T] {
        let p = self.check::<T>(byte_offset, n);
        // SAFETY: in bounds and aligned (checked); T is Pod and the memory was zero-initialised,
        // so every element is a valid T; aliasing is the caller's contract.
        unsafe { std::slice::from_raw_parts(p, n) }
    }

    /// A mutable view of `n` elements at `byte_offset`.
    ///
    /// # Safety
    /// No other slice (shared or mutable, in any thread) may overlap this range while the
    /// returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T: Pod>(&self, byte_offset: usize, n: usize) -> &mut [T] {
        let p = self.check::<T>(byte_offset, n);
        // SAFETY: in bounds, aligned, valid for T (see `slice`); exclusivity is the caller's
        // contract.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `new` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        // A map is unmapped when `backing` drops.
    }
}
