//! Link emulation: each rank's send and receive ports are FIFO servers of a given rate, and
//! every transfer also pays a fixed latency. Used to hold measured StragglAR/Ring ratios
//! against the cost model on a machine whose memory is far faster than the emulated links.
//! A multicast send holds the sender's port once, for its latency and bytes, and every
//! receiver's port from the same start (each as soon as it is free).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::now_ns;

/// The emulated link of every rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkModel {
    /// Bytes per second per direction; `None` for no cap.
    pub bytes_per_second: Option<f64>,
    /// Added to every transfer.
    pub latency: Duration,
}

/// Sleeps until CLOCK_MONOTONIC reaches `deadline_ns`.
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: valid timespec; interrupted sleeps are retried by the loop.
    while unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    } == libc::EINTR
    {}
}

impl LinkModel {
    /// Whether transfers cost anything.
    pub fn is_active(&self) -> bool {
        self.bytes_per_second.is_some() || !self.latency.is_zero()
    }

    fn duration_ns(&self, bytes: usize) -> u64 {
        let wire = self
            .bytes_per_second
            .map_or(0.0, |rate| bytes as f64 / rate * 1e9);
        self.latency.as_nanos() as u64 + wire as u64
    }

    /// Books a multicast send of `bytes` from `send` (the source's port) to every port of
    /// `receivers`: the send port once, from when it is free; each receive port from that
    /// start or when it is free, whichever is later. Returns when the last receiver has it.
    pub fn book_multicast<'a>(
        &self,
        send: &AtomicU64,
        receivers: impl IntoIterator<Item = &'a AtomicU64>,
        bytes: usize,
    ) -> u64 {
        let duration = self.duration_ns(bytes);
        let start = loop {
            let s = send.load(Ordering::Acquire);
            let start = now_ns().max(s);
            if send
                .compare_exchange(s, start + duration, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break start;
            }
        };
        let mut last = start + duration;
        for receive in receivers {
            let end = loop {
                let r = receive.load(Ordering::Acquire);
                let end = start.max(r) + duration;
                if receive
                    .compare_exchange(r, end, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break end;
                }
            };
            last = last.max(end);
        }
        last
    }

    /// Books a transfer of `bytes` on `send` (the source's port) and `receive` (the
    /// destination's), each a "free at" time; returns when it completes.
    pub fn book(&self, send: &AtomicU64, receive: &AtomicU64, bytes: usize) -> u64 {
        let duration = self.duration_ns(bytes);
        loop {
            let (s, r) = (
                send.load(Ordering::Acquire),
                receive.load(Ordering::Acquire),
            );
            let start = now_ns().max(s).max(r);
            let end = start + duration;
            if send
                .compare_exchange(s, end, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if receive
                .compare_exchange(r, end, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Give the send port back unless someone booked after us.
                let _ = send.compare_exchange(end, s, Ordering::AcqRel, Ordering::Acquire);
                continue;
            }
            return end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_serialises_its_transfers() {
        let link = LinkModel {
            bytes_per_second: Some(1e9),
            latency: Duration::from_micros(10),
        };
        let (send, a, b) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let first = link.book(&send, &a, 1_000_000);
        let second = link.book(&send, &b, 1_000_000);
        assert!(
            second >= first + 1_010_000,
            "the same send port: one after the other"
        );
        let other = AtomicU64::new(0);
        let parallel = link.book(&other, &AtomicU64::new(0), 1_000_000);
        assert!(parallel < second, "different ports run side by side");
    }

    #[test]
    fn a_multicast_send_reaches_every_receiver_at_once() {
        let link = LinkModel {
            bytes_per_second: Some(1e9),
            latency: Duration::from_micros(10),
        };
        let one = 1_010_000; // 1 MB at 1 GB/s, and the latency
        let send = AtomicU64::new(0);
        let receivers: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        // One receiver is busy until well after the send starts: it takes it once free.
        let busy_until = now_ns() + 50_000_000;
        receivers[3].store(busy_until, Ordering::Release);
        let last = link.book_multicast(&send, &receivers, 1_000_000);
        // The send port is held once; the free receivers take the send from its start.
        let start = send.load(Ordering::Acquire) - one;
        for r in &receivers[..3] {
            assert_eq!(r.load(Ordering::Acquire), start + one);
        }
        assert_eq!(receivers[3].load(Ordering::Acquire), busy_until + one);
        assert_eq!(last, busy_until + one);
    }
}
