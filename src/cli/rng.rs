//! A small deterministic generator (xorshift64*) for the CLI's drawn workloads: the same seed
//! draws the same sequence on every rank and every run.

/// The generator's state; never 0 (a zero state draws zeros forever).
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (its low bit set, so the state is never 0).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next draw, uniform over `u64`.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A draw in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
