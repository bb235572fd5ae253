//! Cutting `count` elements into chunks whose boundaries sit on 16-byte multiples.

/// Alignment of chunk boundaries and arena slots, in bytes (one 16-byte vector load).
pub const ALIGN_BYTES: usize = 16;

/// Elements `start..end` of the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ElementRange {
    pub start: usize,
    pub end: usize,
}

impl ElementRange {
    /// Elements in the range.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// Cuts `count` elements of `elem_size` bytes into `chunks` ranges: disjoint, in order, covering
/// `0..count` exactly, every boundary a multiple of 16 bytes (or of the element size where that
/// is larger), sizes as even as that allows (trailing chunks may be empty for tiny counts).
pub fn chunk_ranges(count: usize, elem_size: usize, chunks: usize) -> Vec<ElementRange> {
    (0..chunks)
        .map(|c| chunk_range(count, elem_size, chunks, c))
        .collect()
}

/// Chunk `chunk` of [`chunk_ranges`], computed alone (no allocation).
pub fn chunk_range(count: usize, elem_size: usize, chunks: usize, chunk: usize) -> ElementRange {
    assert!(chunks > 0 && elem_size > 0 && chunk < chunks);
    let unit = (ALIGN_BYTES / elem_size).max(1);
    let units = count.div_ceil(unit);
    ElementRange {
        start: (chunk * units / chunks * unit).min(count),
        end: ((chunk + 1) * units / chunks * unit).min(count),
    }
}

/// Bytes of one arena slot when `count` elements of `elem_size` bytes are cut into `chunks`:
/// the largest chunk of [`chunk_ranges`] (at most one 16-byte unit above an even share),
/// rounded up to [`ALIGN_BYTES`]. Every produced value gets one slot of this size, so a value's
/// place in the arena follows from its slot index and the count alone (`sg_layout_of` in
/// cuda/stragglar_allreduce.cu computes the same). A chunk clipped at `count` ends in a
/// partial unit, which the rounding restores: no clipping is needed here.
pub fn slot_bytes(count: usize, elem_size: usize, chunks: usize) -> usize {
    assert!(chunks > 0 && elem_size > 0);
    let unit = (ALIGN_BYTES / elem_size).max(1);
    let units = count.div_ceil(unit);
    align_up(units.div_ceil(chunks) * unit * elem_size)
}

/// Rounds `bytes` up to a multiple of [`ALIGN_BYTES`].
pub fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_exactly_with_aligned_boundaries() {
        for elem in [1, 2, 4, 8] {
            for chunks in 1..=9 {
                for count in (0..200).chain([1023, 4097, 1_000_003]) {
                    let r = chunk_ranges(count, elem, chunks);
                    assert_eq!(r.len(), chunks);
                    assert_eq!(r[0].start, 0);
                    assert_eq!(r[chunks - 1].end, count);
                    for w in r.windows(2) {
                        assert_eq!(w[0].end, w[1].start);
                    }
                    for c in &r[..chunks - 1] {
                        assert_eq!(
                            (c.end * elem) % ALIGN_BYTES.max(elem),
                            0,
                            "{count} {elem} {chunks}"
                        );
                    }
                    let max = r.iter().map(ElementRange::len).max().unwrap();
                    let min_nonempty_target = count / chunks;
                    assert!(
                        max <= min_nonempty_target + 2 * (ALIGN_BYTES / elem).max(1),
                        "uneven: {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_slot_holds_the_largest_chunk_and_no_more_than_one_unit_above_an_even_share() {
        for elem in [1, 2, 4, 8] {
            for chunks in 1..=17 {
                for count in (0..300).chain([1023, 4097, 65_537, 1_000_003]) {
                    let slot = slot_bytes(count, elem, chunks);
                    let largest = chunk_ranges(count, elem, chunks)
                        .iter()
                        .map(|r| align_up(r.len() * elem))
                        .max()
                        .unwrap();
                    assert_eq!(slot, largest, "{count} x {elem} B in {chunks}");
                    assert!(slot <= align_up(count * elem / chunks) + ALIGN_BYTES.max(elem));
                }
            }
        }
    }

    #[test]
    fn align_up_rounds_to_16() {
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 16);
        assert_eq!(align_up(16), 16);
        assert_eq!(align_up(17), 32);
    }
}
