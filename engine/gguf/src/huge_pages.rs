//! Huge pages for the weights' file mapping, without copying them.
//!
//! Decoding streams every weight once per token, so its speed is the memory bandwidth, and on
//! Linux that depends on how the kernel holds the file in its page cache. A file that was
//! written (downloaded, quantized, copied) sits in small 4 KiB pages scattered over physical
//! memory; one read back sequentially with read-ahead can sit in 2 MiB folios, which the kernel
//! maps with one TLB entry each. On the 2-core x86 VM this project is benchmarked on, streaming
//! the 1.1B test model's mapping read 19.8 GB/s from 4 KiB pages and 30 GB/s from 2 MiB ones,
//! and decoding was 15–25% faster.
//!
//! So `settle` checks a 2 MiB probe window of the mapping; when its pages are small, it drops
//! the window from the page cache and reads it back with the mapping marked `MADV_HUGEPAGE`.
//! Only if that gives a huge page does it do the same for the whole file (one sequential
//! re-read, about 0.7 s for 700 MB here). The weights stay one read-only mapping of the file:
//! nothing is copied into the process. Kernels or filesystems without large page-cache folios
//! (or a machine whose memory is too fragmented) leave the probe small, and then nothing more
//! is done. `EDGE_RUN_HUGE_PAGES=0` turns it off.

use std::time::Instant;

/// What `settle` found or did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HugePages {
    /// Not attempted: not a file mapping, too small, not Linux, or turned off.
    NotAttempted,
    /// The probe window was already mapped with a huge page.
    AlreadyHuge,
    /// The file was read back into huge pages.
    Relaid {
        /// MiB of the mapping held in huge pages afterwards.
        huge_mib: u64,
        /// Seconds the re-read took.
        seconds: f64,
    },
    /// The probe window stayed in small pages after a re-read: this kernel, filesystem or
    /// memory state cannot give the file huge pages.
    Unsupported,
}

/// 2 MiB: the size of a PMD-mapped huge page on x86-64 and on aarch64 with 4 KiB pages.
const HUGE: usize = 2 << 20;

/// Whether `EDGE_RUN_HUGE_PAGES` turns the re-read off (`0`, `off`, `no`, `false`).
fn disabled() -> bool {
    std::env::var("EDGE_RUN_HUGE_PAGES")
        .is_ok_and(|v| matches!(v.trim(), "0" | "off" | "no" | "false"))
}

/// Kibibytes of `map` that this process maps with PMD-sized file pages (`FilePmdMapped` of the
/// mapping's entry in `/proc/self/smaps`), or `None` where that cannot be read.
#[cfg(target_os = "linux")]
fn pmd_mapped_kib(map: &memmap2::Mmap) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let at = map.as_ptr() as usize;
    let mut inside = false;
    for line in smaps.lines() {
        // A mapping's header: "start-end perms offset dev inode [path]", in hex.
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo <= at && at < hi;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("FilePmdMapped:") {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

/// Drops `len` bytes of `map` at `offset` from this process and from the page cache, then reads
/// them back (read-ahead in huge folios where the mapping is marked `MADV_HUGEPAGE`).
#[cfg(target_os = "linux")]
fn reread(
    map: &memmap2::Mmap,
    file: &std::fs::File,
    offset: usize,
    len: usize,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a shared, read-only map of a file: MADV_DONTNEED only unmaps the pages from this
    // process, and every later read faults the file's same bytes back in (see
    // `Gguf::release_resident_pages`). Nothing writes the mapping.
    unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) }?;
    let (off, n) = (
        i64::try_from(offset).unwrap_or(i64::MAX),
        i64::try_from(len).unwrap_or(i64::MAX),
    );
    // SAFETY: FFI call with a valid open descriptor and plain integers; POSIX_FADV_DONTNEED
    // only drops clean, unmapped page-cache pages of the file (a hint: it cannot change data).
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    map.advise_range(memmap2::Advice::PopulateRead, offset, len)
}

/// Gives the mapping huge pages where the kernel can (see the module docs). Errors of the
/// advisory calls are not fatal: the mapping stays valid whatever they did.
#[cfg(target_os = "linux")]
pub(crate) fn settle(map: &memmap2::Mmap, file: &std::fs::File) -> std::io::Result<HugePages> {
    let base = map.as_ptr() as usize;
    // The first 2 MiB-aligned window inside the mapping (a file mapping is placed so that
    // virtual addresses and file offsets agree modulo 2 MiB where huge pages are possible).
    let probe = base.next_multiple_of(HUGE) - base;
    if disabled() || map.len() < (probe + HUGE).max(8 << 20) {
        return Ok(HugePages::NotAttempted);
    }
    let t0 = Instant::now();
    map.advise(memmap2::Advice::HugePage)?;
    map.advise_range(memmap2::Advice::PopulateRead, probe, HUGE)?;
    if pmd_mapped_kib(map).unwrap_or(0) >= (HUGE >> 10) as u64 {
        return Ok(HugePages::AlreadyHuge);
    }
    reread(map, file, probe, HUGE)?;
    if pmd_mapped_kib(map).unwrap_or(0) < (HUGE >> 10) as u64 {
        return Ok(HugePages::Unsupported);
    }
    reread(map, file, 0, map.len())?;
    Ok(HugePages::Relaid {
        huge_mib: pmd_mapped_kib(map).unwrap_or(0) >> 10,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Off Linux: nothing to do.
#[cfg(not(target_os = "linux"))]
pub(crate) fn settle(_: &memmap2::Mmap, _: &std::fs::File) -> std::io::Result<HugePages> {
    Ok(HugePages::NotAttempted)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn smaps_finds_the_mapping() {
        // A fresh temporary file of 8 MiB: whatever the kernel does with it, its mapping is
        // found in smaps (a number, possibly 0) and `settle` leaves the bytes as written.
        let path = std::env::temp_dir().join(format!("edge-huge-{}.bin", std::process::id()));
        let bytes: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a file this test created and nobody else writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert!(pmd_mapped_kib(&map).is_some());
        let outcome = settle(&map, &file).unwrap();
        assert!(
            !matches!(outcome, HugePages::NotAttempted) || disabled(),
            "{outcome:?}"
        );
        assert!(map[..] == bytes[..]);
        drop(map);
        let _ = std::fs::remove_file(&path);
    }
}
