//! `host_micro`, the simulated twin of `shootdown validate`'s cases: who gets a flush IPI is
//! the lazy-TLB policy's, and a calibrated profile's `[machine]` table is checked.

use shootdown_experiments::{load, run_points};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn write(dir: &str, name: &str, text: &str) -> PathBuf {
    let dir = repo().join("target").join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// One VM of two vCPUs on two pCPUs (this project's machines), thread 0 on vCPU 0 and one
/// sibling on vCPU 1.
fn experiment(op: &str, mode: &str, lazy_tlb: &str) -> String {
    let pages = match op {
        "munmap" => "",
        "mprotect" => "pages = 8",
        _ => "pages = 1",
    };
    format!(
        r#"
[experiment]
name = "hm"
profile = "kvm-tdp-host-2023"
metric = "time per iteration"
unit = "us"
repetitions = 1
row_key = "siblings"
rows = [0, 1]
[topology]
sockets = 1
cores_per_socket = 2
threads_per_core = 1
[host]
vcpus_per_vm = 2
[workload]
kind = "host_micro"
op = "{op}"
sibling_mode = "{mode}"
iterations = 100
warmup_iterations = 5
{pages}
[variants.v]
options = {{ lazy_tlb = "{lazy_tlb}", pv_tlb_flush = true, pv_send_ipi = true, set_preempted = "involuntary" }}
"#
    )
}

/// (µs per iteration, TLB-shootdown IPIs taken) with 0 and 1 sibling.
fn run(op: &str, mode: &str, lazy_tlb: &str) -> [(f64, u64); 2] {
    let p = write(
        "host-micro-tests",
        &format!("{op}-{mode}-{lazy_tlb}.toml"),
        &experiment(op, mode, lazy_tlb),
    );
    let exp = load(&p, &[]).unwrap();
    let r = run_points(&exp, false, &[0, 1], 1).unwrap();
    assert!(
        r.iter().all(|r| r.violations.is_empty()),
        "{:?}",
        r[1].violations
    );
    let ipis = |i: usize| r[i].counters.get("tlb_shootdowns").copied().unwrap_or(0);
    [(r[0].value, ipis(0)), (r[1].value, ipis(1))]
}

const ITERATIONS: u64 = 105;

#[test]
fn a_busy_sibling_takes_every_flush() {
    let [alone, busy] = run("madvise", "busy", "mainline");
    assert_eq!(alone.1, 0);
    assert_eq!(busy.1, ITERATIONS, "one IPI per madvise");
    assert!(
        busy.0 > alone.0 * 1.5,
        "the IPI costs: {busy:?} vs {alone:?}"
    );
}

#[test]
fn a_sleeping_sibling_is_lazy_and_skipped_by_mainline_but_not_by_legacy() {
    let [alone, sleeping] = run("madvise", "sleeping", "mainline");
    assert!(sleeping.1 <= 1, "mainline skips the lazy CPU: {sleeping:?}");
    assert!((sleeping.0 - alone.0).abs() < 0.05 * alone.0);
    // v4.12: a lazy CPU stays in mm_cpumask and takes the IPI (then leaves the mm: once).
    let [_, legacy] = run("madvise", "sleeping", "legacy");
    assert!(legacy.1 >= 1, "{legacy:?}");
}

#[test]
fn a_freed_page_table_reaches_the_lazy_cpu_twice_then_never() {
    // munmap frees the region's page table: mainline's should_flush_tlb() sends the lazy CPU
    // the IPI, and the handler switches it to init_mm. The CPU stays in mm_cpumask (6.13+
    // updates it lazily) until the next flush IPI finds it on another mm and clears its bit;
    // later munmaps leave it alone.
    let [_, sleeping] = run("munmap", "sleeping", "mainline");
    assert_eq!(sleeping.1, 2, "{sleeping:?}");
    let [_, busy] = run("munmap", "busy", "mainline");
    assert_eq!(busy.1, ITERATIONS);
}

#[test]
fn an_mprotect_pair_flushes_twice() {
    // The downgrade and, on x86, the upgrade too (pte_needs_flush: any change of _PAGE_RW).
    let [alone, busy] = run("mprotect", "busy", "mainline");
    assert_eq!(alone.1, 0);
    assert_eq!(busy.1, 2 * ITERATIONS, "{busy:?}");
}

#[test]
fn too_many_siblings_is_an_error_naming_the_key() {
    let text = experiment("madvise", "busy", "mainline").replace("rows = [0, 1]", "rows = [2]");
    let p = write("host-micro-tests", "too-many.toml", &text);
    let e = load(&p, &[]).map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("siblings") && e.contains("2 siblings need 3 CPUs"),
        "{e}"
    );
}

#[test]
fn a_profile_machine_table_is_checked() {
    let dir = "host-micro-profiles";
    let profile = |machine: &str| {
        format!(
            "[profile]\nname = \"calibrated\"\ninherits = \"kvm-tdp-host-2023\"\n\n[machine]\n{machine}\n"
        )
    };
    let exp = experiment("madvise", "busy", "mainline")
        .replace("kvm-tdp-host-2023", "calibrated")
        .replace("rows = [0, 1]", "rows = [0]");
    // The profile is found in $SHOOTDOWN_PROFILES only if set; put it beside the experiment.
    let p = write(dir, "exp.toml", &exp);
    let good = "cpu_model = \"AMD EPYC\"\nonline_cpus = 2\npv_tlb_flush = true";
    write(
        &format!("{dir}/profiles"),
        "calibrated.toml",
        &profile(good),
    );
    load(&p, &[]).unwrap();
    for (machine, key, reason) in [
        (
            "online_cpus = \"two\"",
            "machine.online_cpus",
            "expected an integer",
        ),
        (
            "pv_tlb_flush = 1",
            "machine.pv_tlb_flush",
            "expected boolean",
        ),
        ("cpus = 2", "machine.cpus", "unknown key"),
    ] {
        write(
            &format!("{dir}/profiles"),
            "calibrated.toml",
            &profile(machine),
        );
        let e = load(&p, &[]).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("calibrated.toml") && e.contains(key) && e.contains(reason),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
    }
}
