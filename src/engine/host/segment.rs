//! One rank's shared-memory segment: header, two banks of flags, two arenas.

use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// `SegmentHeader::magic` once the owner has initialised the segment.
const MAGIC: u64 = 0x5354_5241_4747_4c52;
/// Bytes reserved for the header.
const HEADER_BYTES: usize = 256;
/// Alignment of the flag banks and arenas.
const REGION_ALIGN: usize = 64;

/// The start of every segment. All fields are atomics: peers read and write them.
#[repr(C)]
pub struct SegmentHeader {
    /// `MAGIC` once initialised.
    pub magic: AtomicU64,
    /// The owner's process id.
    pub pid: AtomicI32,
    /// 1 once the owner has mapped every peer.
    pub ready: AtomicU32,
    /// Number of peers that have mapped this segment.
    pub attached: AtomicU32,
    /// Non-zero once the owner aborted or failed: peers waiting on it give up.
    pub abort: AtomicU32,
    /// Link emulation: when the owner's send port is free (CLOCK_MONOTONIC ns).
    pub send_free_at: AtomicU64,
    /// Link emulation: when the owner's receive port is free (CLOCK_MONOTONIC ns).
    pub recv_free_at: AtomicU64,
    /// Flags per bank, for peers to check the layout.
    pub flags_per_bank: AtomicU64,
    /// Arena bytes per parity, for peers to check the layout.
    pub arena_bytes: AtomicU64,
    /// When the owner entered the call of each parity (CLOCK_MONOTONIC ns): the arrival record.
    pub arrival: [AtomicU64; 2],
    /// The fingerprint of the plan the owner runs in the call of each parity: peers check it
    /// before reading, so ranks that disagree on the plan fail instead of misreading.
    pub plan: [AtomicU64; 2],
    /// Sends of the owner served so far in the call of each parity (see `plan::Turn`); reset by
    /// the owner when it enters the call, advanced by the rank that pulled.
    pub served: [AtomicU32; 2],
    /// The last call the owner finished. A peer that exits or aborts after finishing the
    /// current call has done its part: its published values stay readable in our mapping.
    /// Written before the owner can exit or raise its abort word after that call, so a rank
    /// that sees either reads it again (see `Watch::check`).
    pub finished: AtomicU64,
    /// When the owner finished the call of each parity (CLOCK_MONOTONIC ns). Written before
    /// the owner arrives at its next call, so a rank that completed that next call reads the
    /// previous call's finish of every rank (see `CallRecord::previous_post_ns`).
    pub finish_time: [AtomicU64; 2],
}

/// Sizes of a segment, identical on every rank of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Flag words per bank (the most values any rank's program has).
    pub flags_per_bank: usize,
    /// Arena bytes per parity.
    pub arena_bytes: usize,
}

fn align(x: usize) -> usize {
    x.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

impl SegmentLayout {
    fn flags_at(&self) -> usize {
        HEADER_BYTES
    }

    fn arenas_at(&self) -> usize {
        align(self.flags_at() + 2 * self.flags_per_bank * 4)
    }

    fn arena_stride(&self) -> usize {
        align(self.arena_bytes)
    }

    /// Total bytes of the segment.
    pub fn total(&self) -> usize {
        self.arenas_at() + 2 * self.arena_stride()
    }
}

/// A mapped segment. The mapping is unmapped on drop; the name is unlinked explicitly.
pub struct Segment {
    base: *mut u8,
    layout: SegmentLayout,
}

// SAFETY: the mapping is shared memory accessed only through atomics (header, flags) or through
// arena regions that the protocol gives one writer and no concurrent reader (single assignment
// per call, flags published with release/acquire).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// The shm name of `rank`'s segment in communicator `comm_id`.
pub fn segment_name(comm_id: u64, rank: usize) -> String {
    format!("/stragglar.{comm_id:016x}.{rank}")
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in segment name"))
}

impl Segment {
    /// Creates and maps a new segment (fails if the name exists), zeroed, with the header
    /// initialised for `pid`.
    pub fn create(name: &str, layout: SegmentLayout, pid: i32) -> io::Result<Segment> {
        let cname = c_name(name)?;
        // SAFETY: plain syscall on a NUL-terminated name.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is ours; posix_fallocate sizes the (zero-filled) object and reserves its
        // pages now, so a full /dev/shm fails here with ENOSPC instead of raising SIGBUS at the
        // first write into the mapping.
        let reserved = unsafe { libc::posix_fallocate(fd, 0, layout.total() as libc::off_t) };
        let mapped = if reserved == 0 {
            map(fd, layout)
        } else {
            Err(io::Error::from_raw_os_error(reserved))
        };
        // SAFETY: the mapping (if any) keeps the object alive; the descriptor is not needed.
        unsafe { libc::close(fd) };
        let segment = match mapped {
            Ok(segment) => segment,
            Err(e) => {
                unlink(name);
                return Err(e);
            }
        };
        let header = segment.header();
        header.pid.store(pid, std::sync::atomic::Ordering::Relaxed);
        header.flags_per_bank.store(
            layout.flags_per_bank as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        header.arena_bytes.store(
            layout.arena_bytes as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        header
            .magic
            .store(MAGIC, std::sync::atomic::Ordering::Release);
        Ok(segment)
    }

    /// Maps an existing segment if it is initialised with the same layout; `Ok(None)` when it
    /// does not exist or is not initialised yet (try again later).
    pub fn open(name: &str, layout: SegmentLayout) -> io::Result<Option<Segment>> {
        let cname = c_name(name)?;
        // SAFETY: plain syscall on a NUL-terminated name.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: a zeroed stat buffer for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and out-pointer.
        let rc = unsafe { libc::fstat(fd, &mut st) };
        let mapped = if rc == 0 && st.st_size as usize == layout.total() {
            map(fd, layout).map(Some)
        } else {
            Ok(None)
        };
        // SAFETY: as in `create`.
        unsafe { libc::close(fd) };
        let Some(segment) = mapped? else {
            return Ok(None);
        };
        let header = segment.header();
        if header.magic.load(std::sync::atomic::Ordering::Acquire) != MAGIC {
            return Ok(None);
        }
        let same = header
            .flags_per_bank
            .load(std::sync::atomic::Ordering::Relaxed)
            == layout.flags_per_bank as u64
            && header
                .arena_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
                == layout.arena_bytes as u64;
        if !same {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} has another layout"),
            ));
        }
        Ok(Some(segment))
    }

    /// The header.
    pub fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping starts with HEADER_BYTES >= size_of::<SegmentHeader>() bytes,
        // page-aligned, and lives as long as `self`.
        unsafe { &*(self.base as *const SegmentHeader) }
    }

    /// The flag of `value` in bank `parity` (0 or 1).
    pub fn flag(&self, parity: usize, value: usize) -> &AtomicU32 {
        assert!(
            parity < 2 && value < self.layout.flags_per_bank,
            "flag out of range"
        );
        let at = self.layout.flags_at() + (parity * self.layout.flags_per_bank + value) * 4;
        // SAFETY: in bounds (asserted), 4-byte aligned, inside a mapping that lives as long as
        // `self`; flags are only ever accessed atomically.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    /// Start of arena `parity` (0 or 1): `layout.arena_bytes` bytes, 64-byte aligned.
    pub fn arena(&self, parity: usize) -> *mut u8 {
        assert!(parity < 2);
        // SAFETY: the offset lies inside the mapping (see `SegmentLayout::total`).
        unsafe {
            self.base
                .add(self.layout.arenas_at() + parity * self.layout.arena_stride())
        }
    }

    /// The layout this segment was mapped with.
    pub fn layout(&self) -> SegmentLayout {
        self.layout
    }
}

fn map(fd: libc::c_int, layout: SegmentLayout) -> io::Result<Segment> {
    // SAFETY: mapping `total` bytes of a shared-memory object of that size.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            layout.total(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Segment {
        base: base as *mut u8,
        layout,
    })
}

/// Removes a segment's name (the memory stays until the last mapping goes). Ignores errors: the
/// name may already be gone.
pub fn unlink(name: &str) {
    if let Ok(cname) = c_name(name) {
        // SAFETY: plain syscall on a NUL-terminated name.
        unsafe { libc::shm_unlink(cname.as_ptr()) };
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; nothing refers to it any more
        // (every reference borrows `self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.layout.total()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn create_open_share_and_unlink() {
        let layout = SegmentLayout {
            flags_per_bank: 10,
            arena_bytes: 1000,
        };
        let name = segment_name(0xfeed_0000 ^ std::process::id() as u64, 0);
        let a = Segment::create(&name, layout, 42).unwrap();
        assert!(
            Segment::create(&name, layout, 42).is_err(),
            "names are exclusive"
        );
        let b = Segment::open(&name, layout).unwrap().expect("initialised");
        assert_eq!(b.header().pid.load(Ordering::Relaxed), 42);
        a.flag(1, 9).store(7, Ordering::Release);
        assert_eq!(b.flag(1, 9).load(Ordering::Acquire), 7);
        // SAFETY: both mappings cover the arena; single-threaded test.
        unsafe {
            *a.arena(1).add(999) = 5;
            assert_eq!(*b.arena(1).add(999), 5);
        }
        let other = SegmentLayout {
            flags_per_bank: 11,
            arena_bytes: 1000,
        };
        assert!(
            !matches!(Segment::open(&name, other), Ok(Some(_))),
            "another layout is never mapped as ours"
        );
        unlink(&name);
        assert!(Segment::open(&name, layout).unwrap().is_none());
        assert_eq!(
            b.flag(1, 9).load(Ordering::Acquire),
            7,
            "mappings outlive the name"
        );
    }
}
