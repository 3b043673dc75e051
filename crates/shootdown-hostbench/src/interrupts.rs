//! The IPI counters of `/proc/interrupts`: the "TLB:" (shootdown flushes received), "CAL:"
//! (function-call IPIs) and "RES:" (rescheduling IPIs) rows, summed over CPUs.

use crate::HostError;

pub(crate) const PATH: &str = "/proc/interrupts";

/// Row sums at one moment; `None` for a row the kernel does not print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub tlb: Option<u64>,
    pub cal: Option<u64>,
    pub res: Option<u64>,
}

impl Counts {
    /// Read `/proc/interrupts` now.
    pub(crate) fn read() -> Result<Self, HostError> {
        let text = std::fs::read_to_string(PATH).map_err(|e| HostError::Unreadable {
            path: PATH.into(),
            cause: e.to_string(),
        })?;
        Ok(parse(&text))
    }

    /// Per-op growth from `self` to `later` over `ops` ops, row by row.
    pub(crate) fn per_op(&self, later: &Counts, ops: u64) -> [Option<f64>; 3] {
        let rate = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) if ops > 0 => Some(b.saturating_sub(a) as f64 / ops as f64),
            _ => None,
        };
        [
            rate(self.tlb, later.tlb),
            rate(self.cal, later.cal),
            rate(self.res, later.res),
        ]
    }
}

/// Sum the per-CPU columns of the TLB, CAL and RES rows. The header line names one column per
/// CPU; a row's description text after them is ignored.
pub(crate) fn parse(text: &str) -> Counts {
    let mut lines = text.lines();
    let ncpus = lines
        .next()
        .map(|h| {
            h.split_whitespace()
                .filter(|t| t.starts_with("CPU"))
                .count()
        })
        .unwrap_or(0);
    let mut counts = Counts::default();
    for line in lines {
        let mut tokens = line.split_whitespace();
        let slot = match tokens.next() {
            Some("TLB:") => &mut counts.tlb,
            Some("CAL:") => &mut counts.cal,
            Some("RES:") => &mut counts.res,
            _ => continue,
        };
        let sum = tokens
            .take(ncpus)
            .map_while(|t| t.parse::<u64>().ok())
            .fold(0u64, u64::saturating_add);
        *slot = Some(sum);
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "           CPU0       CPU1       \n\
  24:          1          0  IO-APIC   5-edge      ACPI:Ged\n\
 NMI:          0          0   Non-maskable interrupts\n\
 RES:       5614       4313   Rescheduling interrupts\n\
 CAL:      41116      34416   Function call interrupts\n\
 TLB:      14162      17032   TLB shootdowns\n";

    #[test]
    fn rows_are_summed_over_cpus_only() {
        let c = parse(SAMPLE);
        assert_eq!(c.tlb, Some(14162 + 17032));
        assert_eq!(c.cal, Some(41116 + 34416));
        assert_eq!(c.res, Some(5614 + 4313));
    }

    #[test]
    fn absent_rows_are_none_and_rates_follow() {
        let c = parse("  CPU0\n  1: 5 foo\n");
        assert_eq!(c, Counts::default());
        let before = parse(SAMPLE);
        let mut after = before;
        after.tlb = after.tlb.map(|t| t + 50);
        let [tlb, cal, res] = before.per_op(&after, 100);
        assert_eq!(tlb, Some(0.5));
        assert_eq!(cal, Some(0.0));
        assert_eq!(res, Some(0.0));
        assert_eq!(c.per_op(&c, 10), [None, None, None]);
    }

    #[test]
    fn this_host_is_readable() {
        Counts::read().expect("/proc/interrupts");
    }
}
