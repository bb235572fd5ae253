//! The alpha-beta cost model of docs/ALGORITHM.md section 4, priced with the round counts of this
//! crate's own schedules. All times are in seconds, sizes in bytes.

use super::ceil_log2;
use super::post_arrival;

/// One GPU's link: `alpha` seconds of latency per round, `bandwidth` bytes per second per
/// direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Latency per round (message), seconds.
    pub alpha: f64,
    /// Bytes per second per link direction (`1 / beta`).
    pub bandwidth: f64,
}

impl Link {
    /// `rounds` rounds that each move `bytes` bytes: `rounds * (alpha + bytes / bandwidth)`.
    pub fn rounds(&self, rounds: usize, bytes: f64) -> f64 {
        rounds as f64 * (self.alpha + bytes / self.bandwidth)
    }
}

/// Post-arrival rounds of this crate's StragglAR schedule for `ranks` ranks and `pieces` pieces
/// per chunk (synthesizes the schedule; the construction is deterministic).
pub fn stragglar_rounds(ranks: usize, pieces: usize) -> usize {
    post_arrival::synthesize(ranks, pieces).len()
}

/// Modelled times of every algorithm for one world size and buffer size, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Times {
    /// Number of ranks.
    pub ranks: usize,
    /// Buffer size in bytes.
    pub bytes: f64,
    /// Post-arrival rounds of our StragglAR schedule (`R(n)`).
    pub stragglar_rounds: usize,
    /// ReduceScatter among the `n-1` early ranks: `(n-2) alpha + (n-2)/(n-1) M beta`.
    pub reduce_scatter: f64,
    /// StragglAR after the straggler arrives: `R alpha + R/(n-1) M beta`.
    pub stragglar_post: f64,
    /// Ring: `2(n-1) alpha + 2(n-1)/n M beta`.
    pub ring: f64,
    /// Recursive halving-doubling, powers of two only: `2 log2 n alpha + 2(n-1)/n M beta`.
    pub halving_doubling: Option<f64>,
    /// Direct before arrival, an AllReduce (Ring) of the `n-1` early ranks:
    /// `2(n-2) alpha + 2(n-2)/(n-1) M beta`.
    pub direct_pre: f64,
    /// Direct after arrival: `ceil(log2 n) (alpha + M beta)`.
    pub direct_post: f64,
}

impl Times {
    /// Prices every algorithm for `ranks >= 2`, `bytes` and `link`, with `rounds` = `R(n)`
    /// (see [`stragglar_rounds`]).
    pub fn new(ranks: usize, rounds: usize, bytes: f64, link: Link) -> Self {
        let n = ranks as f64;
        let early = ranks - 1;
        Times {
            ranks,
            bytes,
            stragglar_rounds: rounds,
            reduce_scatter: link.rounds(early - 1, bytes / (n - 1.0)),
            stragglar_post: link.rounds(rounds, bytes / (n - 1.0)),
            ring: link.rounds(2 * early, bytes / n),
            halving_doubling: ranks.is_power_of_two().then(|| {
                2.0 * ceil_log2(ranks) as f64 * link.alpha
                    + 2.0 * (n - 1.0) / n * bytes / link.bandwidth
            }),
            direct_pre: link.rounds(2 * (early - 1), bytes / (n - 1.0)),
            direct_post: link.rounds(ceil_log2(ranks), bytes),
        }
    }

    /// The whole call for a straggler that arrives `delay` seconds after the `(n-1)`-th rank.
    pub fn with_delay(&self, delay: f64) -> Completion {
        let stragglar = delay.max(self.reduce_scatter) + self.stragglar_post;
        let ring = delay + self.ring;
        // max(D, T_RS) + T_post = D + T_ring has its root at D = T_RS + T_post - T_ring when
        // T_post < T_ring; below zero StragglAR wins at every delay. Otherwise it never wins.
        let break_even = (self.stragglar_post < self.ring)
            .then(|| (self.reduce_scatter + self.stragglar_post - self.ring).max(0.0));
        Completion {
            delay,
            stragglar,
            ring,
            halving_doubling: self.halving_doubling.map(|t| delay + t),
            direct: delay.max(self.direct_pre) + self.direct_post,
            speedup_post: self.ring / self.stragglar_post,
            speedup_call: ring / stragglar,
            break_even,
        }
    }
}

/// NCCL's NVLink SHARP (NVLS) AllReduce, which NCCL runs by default on NVSwitch servers of
/// Hopper and later: every GPU sends its `M` bytes to the switch, which reduces them and
/// multicasts the result back, so the whole call moves about `M` per GPU.
///
/// It is priced from NCCL's published large-message figures on 8-GPU H100 NVSwitch servers
/// (450 GB/s line rate per direction): NVLS reaches about 480 GB/s bus bandwidth, which is
/// 480 x 8 / 14 = 274 GB/s of algorithm bandwidth, where Ring reaches about 370 GB/s bus
/// bandwidth. This model's `bandwidth` is what point-to-point transfers reach (Ring's
/// efficiency, which StragglAR's transfers are assumed to share), so NVLS's algorithm bandwidth
/// is [`Nvls::PUBLISHED_RATIO`] of it. Its latency is two rounds: a reduction through the switch
/// and a multicast store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvls {
    /// NVLS's algorithm bandwidth over the point-to-point bandwidth of the link (> 0).
    pub ratio: f64,
}

impl Nvls {
    /// 274 / 370: NVLS's published algorithm bandwidth over Ring's bus bandwidth, 8x H100.
    pub const PUBLISHED_RATIO: f64 = (480.0 * 8.0 / 14.0) / 370.0;
    /// The largest communicator the published figure describes (one 8-GPU server); larger
    /// ones are not priced.
    pub const MAX_RANKS: usize = 8;

    /// NVLS's time for one AllReduce of `bytes` among `ranks` ranks on `link`, seconds, from the
    /// moment every rank has arrived: `2 alpha + M / (ratio B)`. `None` above
    /// [`Nvls::MAX_RANKS`] ranks.
    pub fn time(&self, ranks: usize, bytes: f64, link: Link) -> Option<f64> {
        (ranks <= Self::MAX_RANKS).then(|| 2.0 * link.alpha + bytes / (self.ratio * link.bandwidth))
    }
}

/// StragglAR over NVLink multicast (`Algorithm::Multicast`): before the straggler arrives, the
/// `n-1` early ranks reduce-scatter among themselves and every owner writes its reduced chunk
/// into the straggler's staging, so the straggler holds `P`, the early ranks' partial sum; when
/// it arrives it combines `P` with its input chunk by chunk and multicasts each complete chunk
/// once into every rank's staging.
///
/// Pricing, each assumption named (docs/SCHEDULES.md, "Multicast StragglAR in the model"):
/// - a multicast store stream runs at `ratio` times the point-to-point bandwidth `B`, limited
///   by the receiving port: every receiver takes its bytes once, whatever the fan-out;
/// - the gather of `P` costs one round and `M / (ratio B)`: the straggler's receive port takes
///   all of `P` (`M` bytes), from every owner at once (point-to-point, at the multicast rate
///   for simplicity: the two are assumed equal by default);
/// - the broadcast costs one round and `M / (ratio B)`; the straggler's combine of each chunk
///   overlaps the broadcast of the one before, and the first chunk's combine is left out;
/// - the call completes at `max(D, T_pre) + T_post`: the broadcast is not started before the
///   gather into the straggler is done.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Multicast {
    /// The multicast store rate over the point-to-point bandwidth of the link (> 0).
    pub ratio: f64,
}

impl Multicast {
    /// The assumed default: multicast stores from one GPU move at the rate point-to-point
    /// copies reach (NCCL's Ring: about 370 GB/s of a 450 GB/s line on 8x H100). Not
    /// measured; NVLS itself uses about 69% of the line (its reduction traffic included).
    pub const ASSUMED_RATIO: f64 = 1.0;

    /// The phases of one call of `bytes` among `ranks >= 2` ranks on `link`.
    pub fn times(&self, ranks: usize, bytes: f64, link: Link) -> MulticastTimes {
        let early = ranks - 1;
        let broadcast = link.alpha + bytes / (self.ratio * link.bandwidth);
        MulticastTimes {
            reduce_scatter: link.rounds(early - 1, bytes / early as f64),
            gather: broadcast,
            post: broadcast,
        }
    }
}

/// Modelled phases of multicast StragglAR ([`Multicast`]), seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MulticastTimes {
    /// ReduceScatter among the early ranks, as for point-to-point StragglAR.
    pub reduce_scatter: f64,
    /// The owners' writes of `P` into the straggler: `alpha + M / (ratio B)` (its receive port
    /// takes all of `P`; the rounds overlap, one latency is priced).
    pub gather: f64,
    /// After the straggler arrives: its broadcast of the complete chunks, `alpha + M / (ratio
    /// B)` (one latency: the chunks stream back to back, where the schedule's round model
    /// counts one round per chunk).
    pub post: f64,
}

impl MulticastTimes {
    /// Everything before the straggler's arrival can be used: `T_RS + T_gather`.
    pub fn pre(&self) -> f64 {
        self.reduce_scatter + self.gather
    }

    /// The call for a straggler `delay` seconds after the `(n-1)`-th arrival:
    /// `max(D, T_pre) + T_post`.
    pub fn completion(&self, delay: f64) -> f64 {
        delay.max(self.pre()) + self.post
    }

    /// The smallest delay from which it is at least as fast as an algorithm that takes
    /// `other` seconds once every rank has arrived (`D + other`); `None` when it never is.
    pub fn break_even(&self, other: f64) -> Option<f64> {
        (self.post < other).then(|| (self.pre() + self.post - other).max(0.0))
    }
}

/// Completion times measured from the `(n-1)`-th arrival, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    /// The straggler's delay `D`.
    pub delay: f64,
    /// StragglAR: `max(D, T_RS) + T_post`.
    pub stragglar: f64,
    /// Ring: `D + T_ring`.
    pub ring: f64,
    /// Halving-doubling: `D + T_rhd` (powers of two only).
    pub halving_doubling: Option<f64>,
    /// Direct: `max(D, T_pre) + T_post`.
    pub direct: f64,
    /// After the straggler's arrival: `T_ring / T_post` (what the paper reports).
    pub speedup_post: f64,
    /// The whole call: `(D + T_ring) / (max(D, T_RS) + T_post)`.
    pub speedup_call: f64,
    /// The smallest delay from which StragglAR is at least as fast as Ring; `None` when it
    /// never is.
    pub break_even: Option<f64>,
}

/// The pipelined post-arrival phase with the number of pieces per chunk that minimises it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pipelining {
    /// Pieces per chunk `k`.
    pub pieces: usize,
    /// Post-arrival rounds with `k` pieces.
    pub rounds: usize,
    /// Post-arrival time with `k` pieces: `R_k alpha + R_k/((n-1)k) M beta`.
    pub time: f64,
    /// The floor `M / B`: the straggler must send and receive `M` bytes.
    pub floor: f64,
}

/// Finds the `k` in `1..=max_pieces` that minimises the post-arrival time, given `rounds(k)`
/// (the post-arrival rounds with `k` pieces). Stops early once `k` alone costs more latency
/// than the best time found.
pub fn best_pipelining(
    ranks: usize,
    bytes: f64,
    link: Link,
    max_pieces: usize,
    rounds: impl Fn(usize) -> usize,
) -> Pipelining {
    let early = ranks - 1;
    let time = |k: usize, r: usize| link.rounds(r, bytes / (early * k) as f64);
    let first = rounds(1);
    let mut best = Pipelining {
        pieces: 1,
        rounds: first,
        time: time(1, first),
        floor: bytes / link.bandwidth,
    };
    for k in 2..=max_pieces {
        // Every k needs at least (n-1)k rounds and moves at least M bytes per rank.
        if link.rounds(early * k, 0.0) + best.floor >= best.time {
            break;
        }
        let r = rounds(k);
        let t = time(k, r);
        if t < best.time {
            best = Pipelining {
                pieces: k,
                rounds: r,
                time: t,
                floor: best.floor,
            };
        }
    }
    best
}
