//! What a communicator's AllReduce calls did, said at INFO when it is destroyed.

use crate::nccl::types::ncclComm_t;
use crate::registry::fallback::Fallback;
use crate::registry::stats::StatsSnapshot;

/// One line: the calls, where they ran, and every cause that kept them on NCCL.
pub fn summary(comm: ncclComm_t, stats: &StatsSnapshot) -> String {
    let info = crate::registry::comms().get(comm);
    let field = |v: Option<i32>| v.map_or("?".to_string(), |v| v.to_string());
    let causes: Vec<String> = Fallback::ALL
        .iter()
        .filter(|f| stats.fallbacks[f.index()] > 0)
        .map(|f| format!("{} {}", f.name(), stats.fallbacks[f.index()]))
        .collect();
    format!(
        "AllReduce report for communicator {comm:p} (rank {} of {}, device {}): {} calls, {} on StragglAR, {} on NCCL{}",
        field(info.as_ref().and_then(|i| i.rank)),
        field(info.as_ref().and_then(|i| i.nranks)),
        field(info.as_ref().and_then(|i| i.cuda_device)),
        stats.calls,
        stats.on_stragglar,
        stats.on_nccl(),
        if causes.is_empty() {
            String::new()
        } else {
            format!(" ({})", causes.join(", "))
        }
    )
}

/// Logs [`summary`] at INFO when the communicator made any AllReduce call.
pub fn log_at_destroy(comm: ncclComm_t, stats: &StatsSnapshot) {
    if stats.calls > 0 {
        log::info!("{}", summary(comm, stats));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_every_cause_with_its_count() {
        let mut stats = StatsSnapshot {
            calls: 10,
            on_stragglar: 3,
            ..Default::default()
        };
        stats.fallbacks[Fallback::TooFewRanks.index()] = 5;
        stats.fallbacks[Fallback::InGroup.index()] = 2;
        let text = summary(0x77 as ncclComm_t, &stats);
        assert!(
            text.contains("10 calls, 3 on StragglAR, 7 on NCCL"),
            "{text}"
        );
        assert!(text.contains("too-few-ranks 5, in-group 2"), "{text}");
    }
}
