//! How a StragglAR call runs once its straggler has arrived: the point-to-point schedule (cut
//! into pieces or not), or one multicast of the straggler's input where the communicator has a
//! multicast region. Both reach the same result bit for bit; which is faster depends on the
//! straggler's lead and on the machine, so the model picks a class's first finish and
//! measurement then refines it (`estimate::ClassTimes::finish_for_next`), alike on every rank.

/// The finish of a StragglAR call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Finish {
    /// The point-to-point schedule, each chunk cut into this many pieces (1: the plain schedule;
    /// 0, a class's finish before its first StragglAR call, reads as 1 wherever a plan is made).
    Pieces(usize),
    /// One multicast of the straggler's input into every rank's region, after the early ranks'
    /// reduce-scatter and multicast gather (never pipelined).
    Multicast,
}

impl Finish {
    /// Pieces per chunk of the call's plan (1 for a multicast finish).
    pub fn pieces(self) -> usize {
        match self {
            Finish::Pieces(k) => k.max(1),
            Finish::Multicast => 1,
        }
    }

    /// Whether the call finishes by one multicast.
    pub fn is_multicast(self) -> bool {
        self == Finish::Multicast
    }
}

impl std::fmt::Display for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Finish::Multicast => write!(f, "one multicast"),
            Finish::Pieces(0 | 1) => write!(f, "point to point"),
            Finish::Pieces(k) => write!(f, "point to point, {k} pieces per chunk"),
        }
    }
}

/// `STRAGGLAR_MULTICAST`: whether the GPU engine forms a multicast region per communicator, and
/// how its StragglAR calls then finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MulticastMode {
    /// No region; StragglAR finishes point to point.
    Off,
    /// `1`: the policy weighs the multicast finish against the point-to-point one per size class
    /// (the model first, then measurement).
    Weighed,
    /// `always`: every StragglAR call finishes by multicast where the region formed (to
    /// benchmark and test the finish alone).
    Always,
}

impl MulticastMode {
    /// `0`, `1` or `always`; `None` otherwise.
    pub fn parse(text: &str) -> Option<MulticastMode> {
        match text {
            "0" => Some(MulticastMode::Off),
            "1" => Some(MulticastMode::Weighed),
            "always" => Some(MulticastMode::Always),
            _ => None,
        }
    }

    /// Whether the engine forms a region.
    pub fn on(self) -> bool {
        self != MulticastMode::Off
    }
}

impl std::fmt::Display for MulticastMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MulticastMode::Off => "0",
            MulticastMode::Weighed => "1",
            MulticastMode::Always => "always",
        })
    }
}
