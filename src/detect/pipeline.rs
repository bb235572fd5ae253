//! How deep StragglAR's calls are pipelined: each chunk cut into `k` pieces, which brings the
//! time after the straggler's arrival toward the floor `M/B` at the cost of more rounds
//! (`schedule::model::best_pipelining`). The model's `k` follows from the settings and the call's
//! size class alone; under `auto`, measurement then refines it per class
//! (`estimate::ClassTimes::finish_for_next`), from times every rank shares. Either way every rank
//! runs the same plan.

use super::classes::size_class;
use crate::schedule::model::{best_pipelining, stragglar_rounds, Link};

/// The most pieces per chunk any call runs: far past the model's best at any size an engine
/// runs (6 at 1 GiB on an 8-GPU NVSwitch server).
pub const MAX_PIECES: usize = 64;

/// `STRAGGLAR_PIPELINE` and `stragglar bench --pipeline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pipeline {
    /// Every chunk cut into this many pieces (1: the plain schedule).
    Pieces(usize),
    /// Per size class, the pieces the cost model finds fastest after arrival on the policy's
    /// link.
    Auto,
}

impl std::fmt::Display for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pipeline::Pieces(k) => write!(f, "{k}"),
            Pipeline::Auto => write!(f, "auto"),
        }
    }
}

impl Pipeline {
    /// `auto`, or a number of pieces from 1 to [`MAX_PIECES`]; `None` otherwise.
    pub fn parse(text: &str) -> Option<Pipeline> {
        match text.trim() {
            "auto" => Some(Pipeline::Auto),
            k => k
                .parse::<usize>()
                .ok()
                .filter(|k| (1..=MAX_PIECES).contains(k))
                .map(Pipeline::Pieces),
        }
    }

    /// The most pieces per chunk a schedule for `ranks` ranks allows (at most
    /// [`MAX_PIECES`]; 1 below 2 ranks).
    pub fn most_pieces(ranks: usize) -> usize {
        match ranks {
            0 | 1 => 1,
            n => crate::schedule::max_pieces_per_chunk(n).clamp(1, MAX_PIECES),
        }
    }

    /// Pieces per chunk of a StragglAR call of `bytes` among `ranks` on `link`: the fixed
    /// count (at most what the schedule allows), or the model's best for the call's size class,
    /// priced at the class's smallest size (`2^(c-1)` bytes), so that a class runs one `k`.
    pub fn pieces(&self, ranks: usize, bytes: usize, link: Link) -> usize {
        let most = Self::most_pieces(ranks);
        match self {
            Pipeline::Pieces(k) => (*k).clamp(1, most),
            Pipeline::Auto if ranks < 3 || bytes == 0 => 1,
            Pipeline::Auto => {
                let smallest = 1u64 << (size_class(bytes) - 1);
                best_pipelining(ranks, smallest as f64, link, most, |k| {
                    stragglar_rounds(ranks, k)
                })
                .pieces
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVSWITCH: Link = Link {
        alpha: 3e-6,
        bandwidth: 370e9,
    };

    #[test]
    fn parse_takes_auto_and_counts_in_range() {
        assert_eq!(Pipeline::parse("auto"), Some(Pipeline::Auto));
        assert_eq!(Pipeline::parse(" 6 "), Some(Pipeline::Pieces(6)));
        for bad in ["0", "65", "-1", "two", ""] {
            assert_eq!(Pipeline::parse(bad), None, "{bad}");
        }
        assert_eq!(Pipeline::Auto.to_string(), "auto");
        assert_eq!(Pipeline::Pieces(3).to_string(), "3");
    }

    /// One `k` per size class, growing with the size: the model's best at 1 GiB on an 8-GPU
    /// NVSwitch server is 6, and small calls stay plain.
    #[test]
    fn auto_picks_one_k_per_size_class() {
        let auto = Pipeline::Auto;
        assert_eq!(auto.pieces(8, 1 << 30, NVSWITCH), 6);
        assert_eq!(
            auto.pieces(8, (1 << 30) + 12345, NVSWITCH),
            auto.pieces(8, (1 << 31) - 1, NVSWITCH),
            "one k per class"
        );
        assert_eq!(auto.pieces(8, 4096, NVSWITCH), 1);
        assert_eq!(auto.pieces(3, 1 << 30, NVSWITCH), 1);
        let ks: Vec<usize> = (10..=31)
            .map(|class| auto.pieces(8, 1 << class, NVSWITCH))
            .collect();
        assert!(ks.windows(2).all(|w| w[0] <= w[1]), "{ks:?}");
        assert_eq!(Pipeline::Pieces(4).pieces(8, 1 << 30, NVSWITCH), 4);
    }

    #[test]
    fn a_fixed_count_is_clamped_to_what_the_schedule_allows() {
        let most = Pipeline::most_pieces(300);
        assert!(most < MAX_PIECES);
        assert_eq!(
            Pipeline::Pieces(MAX_PIECES).pieces(300, 1 << 20, NVSWITCH),
            most
        );
        assert_eq!(Pipeline::Pieces(5).pieces(1, 1 << 20, NVSWITCH), 1);
    }
}
