//! Probe this host and print the standard cases as a table.
//!
//! `cargo run --release -p shootdown-hostbench --example print_cases [-- TARGET_MS REPS] [--json]
//! [FILTER…]`: FILTERs (e.g. `munmap`, `busy`) keep only the cases whose label contains one.

use shootdown_hostbench::{probe, run_case, CaseSpec, Op, SiblingMode};
use std::sync::atomic::AtomicBool;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let mut nums = args.iter().filter_map(|a| a.parse::<f64>().ok());
    let target_ms = nums.next().unwrap_or(30.0);
    let reps = nums.next().map_or(5, |r| r as usize);
    let filters: Vec<&String> = args
        .iter()
        .filter(|a| *a != "--json" && a.parse::<f64>().is_err())
        .collect();

    let info = match probe() {
        Ok(info) => info,
        Err(e) => {
            eprintln!("probe: {e}");
            std::process::exit(1);
        }
    };
    if json {
        println!("{}", serde_json::to_string(&info).unwrap_or_default());
    } else {
        println!(
            "{} | online CPUs {:?} | {} socket(s) × {} core(s) × {} thread(s) ({}) | kernel {}",
            info.cpu_model,
            info.online_cpus,
            info.sockets,
            info.cores_per_socket,
            info.threads_per_core,
            info.topology_source,
            info.kernel_release
        );
        println!(
            "pcid {} invpcid {} invlpgb {} | idle=poll {} | hypervisor {:?} | TLB row {}",
            info.pcid,
            info.invpcid,
            info.invlpgb,
            info.idle_poll,
            info.hypervisor,
            info.interrupts_rows
        );
        if let Some(k) = &info.kvm_features {
            println!(
                "kvm eax {:#x}: steal_time {} pv_eoi {} pv_unhalt {} pv_tlb_flush {} pv_send_ipi {} \
                 poll_control {} pv_sched_yield {} | realtime hint {}",
                k.eax,
                k.steal_time,
                k.pv_eoi,
                k.pv_unhalt,
                k.pv_tlb_flush,
                k.pv_send_ipi,
                k.poll_control,
                k.pv_sched_yield,
                k.hints_realtime
            );
        }
        println!(
            "\n{:<30} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8}",
            "case", "ops/rep", "median", "min", "max", "TLB/op", "CAL/op", "RES/op", "sib CPU"
        );
    }

    let base = |op| CaseSpec {
        target_ms,
        reps,
        ..CaseSpec::new(op)
    };
    let shoot = |op, pages, siblings, sibling_mode| CaseSpec {
        pages,
        siblings,
        sibling_mode,
        ..base(op)
    };
    use SiblingMode::{Busy, Sleeping};
    let cases = [
        base(Op::NullSyscall),
        base(Op::Fault),
        base(Op::CtxSwitch),
        base(Op::WakeIpi),
        base(Op::Migrate),
        shoot(Op::Madvise, 1, 0, Busy),
        shoot(Op::Madvise, 1, 1, Busy),
        shoot(Op::Madvise, 1, 1, Sleeping),
        shoot(Op::Madvise, 32, 0, Busy),
        shoot(Op::Madvise, 32, 1, Busy),
        shoot(Op::Mprotect, 8, 0, Busy),
        shoot(Op::Mprotect, 8, 1, Busy),
        shoot(Op::Munmap, 1, 0, Busy),
        shoot(Op::Munmap, 1, 1, Busy),
        shoot(Op::Munmap, 1, 1, Sleeping),
    ];
    let cancel = AtomicBool::new(false);
    for spec in &cases {
        let label = if spec.op.is_shootdown() {
            let pages = if spec.op == Op::Munmap {
                "2MiB".to_string()
            } else {
                format!("{}p", spec.pages)
            };
            let t = if spec.siblings == 0 {
                "T=0".to_string()
            } else {
                format!("T={} {:?}", spec.siblings, spec.sibling_mode).to_lowercase()
            };
            format!("{} {pages} {t}", spec.op.name())
        } else {
            format!("{} (µs/{})", spec.op.name(), spec.op.unit())
        };
        if !filters.is_empty() && !filters.iter().any(|f| label.contains(f.as_str())) {
            continue;
        }
        match run_case(spec, &cancel) {
            Ok(r) if json => println!("{}", serde_json::to_string(&r).unwrap_or_default()),
            Ok(r) => {
                let rate = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
                println!(
                    "{label:<30} {:>10} {:>9.3} {:>9.3} {:>9.3} {:>8} {:>8} {:>8} {:>8}",
                    r.ops_per_rep,
                    r.median_us,
                    r.min_us,
                    r.max_us,
                    rate(r.tlb_ipis_per_op),
                    rate(r.cal_ipis_per_op),
                    rate(r.res_ipis_per_op),
                    rate(r.sibling_cpu_share)
                );
            }
            Err(e) => println!("{label:<30} error: {e}"),
        }
    }
}
