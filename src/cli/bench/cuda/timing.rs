//! Device time of queued work, by events on one stream of the bench's GPU.

use super::GpuKernels;
use crate::engine::cuda::driver::{Event, GpuError, Stream};

/// A stream and two events: [`Timer::per_run`] times what a closure queues on the stream.
pub struct Timer {
    /// Where the timed work must be queued: the events are recorded on it.
    pub stream: Stream,
    start: Event,
    end: Event,
}

impl Timer {
    /// A stream and two timing events on the bench's GPU.
    pub fn new(gpu: &GpuKernels) -> Result<Timer, GpuError> {
        Ok(Timer {
            stream: Stream::new(&gpu.device)?,
            start: Event::new(&gpu.device)?,
            end: Event::new(&gpu.device)?,
        })
    }

    /// Seconds of device time per run of `work` (which queues on [`Timer::stream`]), over
    /// `runs` runs queued back to back after one untimed run (caches, clocks and lazy loading
    /// warmed).
    pub fn per_run(
        &self,
        runs: usize,
        work: &dyn Fn() -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        let runs = runs.max(1);
        work()?;
        self.start.record(&self.stream)?;
        for _ in 0..runs {
            work()?;
        }
        self.end.record(&self.stream)?;
        Ok(self.start.elapsed_ms(&self.end)? as f64 * 1e-3 / runs as f64)
    }
}
