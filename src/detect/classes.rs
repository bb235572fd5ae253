//! Size classes: the buckets of message sizes that detection, measurement and the pipeline
//! depth are kept apart by.

/// The size class of a call: the bit length of its byte count (a power-of-two bucket).
/// Designations are kept per class: in a DDP step only the first bucket sees the straggler's
/// compute delay.
pub const fn size_class(bytes: usize) -> u32 {
    usize::BITS - bytes.leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_the_bit_length() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 1);
        assert_eq!(size_class(1023), 10);
        assert_eq!(size_class(1024), 11);
        assert_eq!(size_class(usize::MAX), usize::BITS);
    }
}
