//! Link emulation: each rank's send and receive ports are FIFO servers of a given rate, and
//! every transfer also pays a fixed latency. Used to hold measured StragglAR/Ring ratios
//! against the cost model on a machine whose memory is far faster than the emulated links.
//! A multicast send reaches every reader for the price of one: each of its `k` reads holds the
//! source's send port for a `k`-th of the bytes, and its own receive port for all of them.

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

    /// Books a transfer of `bytes` on `send` (the source's port) and `receive` (the
    /// destination's), each a "free at" time; returns when it completes.
    pub fn book(&self, send: &AtomicU64, receive: &AtomicU64, bytes: usize) -> u64 {
        self.book_share(send, receive, bytes, 1)
    }

    /// Books one of `readers >= 1` reads of a multicast send of `bytes`: `send` is held for
    /// `bytes / readers` of them, `receive` for all; returns when the read completes.
    pub fn book_share(
        &self,
        send: &AtomicU64,
        receive: &AtomicU64,
        bytes: usize,
        readers: usize,
    ) -> u64 {
        let sending = self.duration_ns(bytes.div_ceil(readers.max(1)));
        let duration = self.duration_ns(bytes);
        loop {
            let (s, r) = (
                send.load(Ordering::Acquire),
                receive.load(Ordering::Acquire),
            );
            let start = now_ns().max(s).max(r);
            let (sent, end) = (start + sending, start + duration);
            if send
                .compare_exchange(s, sent, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if receive
                .compare_exchange(r, end, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Give the send port back unless someone booked after us.
                let _ = send.compare_exchange(sent, s, Ordering::AcqRel, Ordering::Acquire);
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
    fn the_reads_of_a_multicast_send_share_its_port() {
        let link = LinkModel {
            bytes_per_second: Some(1e9),
            latency: Duration::ZERO,
        };
        let send = AtomicU64::new(0);
        let receivers: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let start = now_ns();
        let ends: Vec<u64> = receivers
            .iter()
            .map(|r| link.book_share(&send, r, 1_000_000, 4))
            .collect();
        // Each read takes its receiver 1 ms; the send port is held 0.25 ms per read.
        for (i, &end) in ends.iter().enumerate() {
            let expected = start + 1_000_000 + i as u64 * 250_000;
            assert!(
                end >= expected && end < expected + 200_000,
                "read {i}: {end}"
            );
        }
        let held = send.load(Ordering::Acquire);
        assert!(
            held >= start + 1_000_000 && held < start + 1_200_000,
            "{held}"
        );
    }
}
