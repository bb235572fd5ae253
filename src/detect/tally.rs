//! A whole run's arrival records summarised for people: how often each rank arrived last, its
//! median and p90 lead when it did, and the designation of each size class (designations are
//! kept per size class: in a DDP step only the first bucket sees the straggler's compute
//! delay). Identical on every rank (the records are), so any rank can print it.

use std::collections::BTreeMap;

use super::rule::ArrivalRecord;

/// Leads kept per rank for the percentiles (the most recent ones).
const LEADS_KEPT: usize = 4096;

/// The summary of a run.
#[derive(Debug, Clone, Default)]
pub struct ArrivalTally {
    ranks: usize,
    calls: u64,
    last_counts: Vec<u64>,
    /// Per rank, the leads (ns) of the most recent calls where it arrived last.
    leads: Vec<Vec<u64>>,
    /// Per size class (log2 of the bytes): the designation, the call it took effect, changes.
    classes: BTreeMap<u32, Designation>,
    on_stragglar: u64,
}

/// One size class's designation history.
#[derive(Debug, Clone, Copy, Default)]
struct Designation {
    current: Option<usize>,
    since: u64,
    changes: u64,
}

/// One rank's line of the report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankArrivals {
    /// Calls whose records were tallied.
    pub calls: u64,
    /// Of them, those where the rank arrived last.
    pub arrived_last: u64,
    /// Its lead when it did (the most recent ones), nanoseconds: median and 90th percentile,
    /// `None` when it never did.
    pub median_lead_ns: Option<u64>,
    pub p90_lead_ns: Option<u64>,
}

/// `q` (0..=1) of `values`, nearest rank; `None` when empty.
fn quantile(values: &[u64], q: f64) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let index = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[index])
}

impl ArrivalTally {
    /// An empty tally for `ranks` ranks.
    pub fn new(ranks: usize) -> Self {
        ArrivalTally {
            ranks,
            last_counts: vec![0; ranks],
            leads: vec![Vec::new(); ranks],
            ..Default::default()
        }
    }

    /// Adds one call: its record, its size class, the class's designation after it, and
    /// whether it ran StragglAR. Returns the class's previous designation when this call
    /// changed it.
    pub fn observe(
        &mut self,
        record: &ArrivalRecord,
        class: u32,
        designated: Option<usize>,
        stragglar: bool,
    ) -> Option<Option<usize>> {
        self.calls += 1;
        self.on_stragglar += stragglar as u64;
        if record.last_rank < self.ranks {
            self.last_counts[record.last_rank] += 1;
            let leads = &mut self.leads[record.last_rank];
            if leads.len() == LEADS_KEPT {
                leads.remove(0);
            }
            if let Some(lead) = record.lead_ns {
                leads.push(lead);
            }
        }
        let calls = self.calls;
        let d = self.classes.entry(class).or_default();
        if designated == d.current {
            return None;
        }
        let before = d.current;
        *d = Designation {
            current: designated,
            since: calls,
            changes: d.changes + 1,
        };
        Some(before)
    }

    /// `rank`'s line of the report (`None` for a rank outside the communicator).
    pub fn rank(&self, rank: usize) -> Option<RankArrivals> {
        let leads = self.leads.get(rank)?;
        Some(RankArrivals {
            calls: self.calls,
            arrived_last: self.last_counts[rank],
            median_lead_ns: quantile(leads, 0.5),
            p90_lead_ns: quantile(leads, 0.9),
        })
    }

    /// The table: one line per rank that ever arrived last (with its host and device from
    /// `members`, indexed by rank, when given), then the decision of each size class.
    pub fn table(&self, members: &[String]) -> String {
        let mut out = format!(
            "# straggler report: {} calls (from the arrival records every rank shares)\n#  rank  arrived-last  median lead  p90 lead\n#                 (%)         (us)      (us)\n",
            self.calls
        );
        for rank in 0..self.ranks {
            let count = self.last_counts[rank];
            if count == 0 {
                continue;
            }
            let us = |q| quantile(&self.leads[rank], q).map_or(0.0, |ns| ns as f64 / 1e3);
            out += &format!(
                "#  {rank:>4}  {:>12.1}  {:>11.1}  {:>8.1}{}\n",
                100.0 * count as f64 / self.calls.max(1) as f64,
                us(0.5),
                us(0.9),
                members
                    .get(rank)
                    .map_or(String::new(), |m| format!("  {m}"))
            );
        }
        for (class, d) in &self.classes {
            let who = d
                .current
                .map_or("no straggler".to_string(), |r| format!("straggler {r}"));
            out += &format!(
                "# sizes 2^{class} B: {who} since call {} ({} change(s))\n",
                d.since, d.changes
            );
        }
        out += &format!(
            "# {} calls on StragglAR, {} on the baseline\n",
            self.on_stragglar,
            self.calls - self.on_stragglar
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(last_rank: usize, lead_ns: u64) -> ArrivalRecord {
        ArrivalRecord {
            last_rank,
            lead_ns: Some(lead_ns),
        }
    }

    #[test]
    fn shares_leads_and_changes_are_reported() {
        let mut t = ArrivalTally::new(4);
        assert_eq!(t.observe(&record(3, 1000), 20, None, false), None);
        for i in 0..8 {
            t.observe(&record(3, 2000 + 1000 * i), 20, None, false);
        }
        assert_eq!(t.observe(&record(1, 500), 20, Some(3), true), Some(None));
        assert_eq!(t.observe(&record(3, 9000), 20, Some(3), true), None);
        assert_eq!(
            t.observe(&record(3, 9000), 12, None, false),
            None,
            "another class"
        );
        let text = t.table(&[]);
        assert!(text.contains("12 calls"), "{text}");
        // Rank 3 was last in 11 of 12 calls; its leads 1000, 2000..9000, 9000, 9000: median
        // 5000 (nearest rank), p90 9000.
        assert!(
            text.contains("     3          91.7          6.0       9.0"),
            "{text}"
        );
        assert!(
            text.contains("     1           8.3          0.5       0.5"),
            "{text}"
        );
        assert!(
            text.contains("sizes 2^20 B: straggler 3 since call 10 (1 change(s))"),
            "{text}"
        );
        assert!(
            text.contains("sizes 2^12 B: no straggler since call 0 (0 change(s))"),
            "{text}"
        );
        assert!(
            text.contains("2 calls on StragglAR, 10 on the baseline"),
            "{text}"
        );
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[5], 0.9), Some(5));
        assert_eq!(quantile(&[1, 2, 3, 4], 0.5), Some(2));
        assert_eq!(quantile(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9), Some(9));
    }
}
