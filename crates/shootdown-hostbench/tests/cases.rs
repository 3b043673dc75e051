//! Every case on this host with tiny budgets, the spec checks, and cancellation. The cases pin
//! threads to the same CPUs and read host-wide IPI counters, so the tests take turns.

use shootdown_hostbench::{
    probe, run_case, CaseResult, CaseSpec, HostError, HostInfo, Op, SiblingMode,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn host() -> HostInfo {
    probe().expect("probe")
}

fn tiny(op: Op) -> CaseSpec {
    CaseSpec {
        reps: 3,
        target_ms: 2.0,
        ..CaseSpec::new(op)
    }
}

fn run(spec: &CaseSpec) -> CaseResult {
    let never = AtomicBool::new(false);
    let r = run_case(spec, &never).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    assert_eq!(&r.spec, spec, "spec echoed");
    assert_eq!(r.us_per_op.len(), spec.reps);
    assert!(r.ops_per_rep >= 1);
    for &t in r
        .us_per_op
        .iter()
        .chain([&r.median_us, &r.min_us, &r.max_us])
    {
        assert!(t.is_finite() && t > 0.0, "{spec:?}: time {t}");
    }
    assert!(r.min_us <= r.median_us && r.median_us <= r.max_us);
    for rate in [r.tlb_ipis_per_op, r.cal_ipis_per_op, r.res_ipis_per_op]
        .into_iter()
        .flatten()
    {
        assert!(rate.is_finite() && rate >= 0.0);
    }
    r
}

#[test]
fn primitives_run() {
    let _t = turn();
    let two = host().online_cpu_count >= 2;
    for op in [
        Op::NullSyscall,
        Op::Fault,
        Op::CtxSwitch,
        Op::WakeIpi,
        Op::Migrate,
    ] {
        let spec = tiny(op);
        if matches!(op, Op::WakeIpi | Op::Migrate) && !two {
            let never = AtomicBool::new(false);
            assert!(matches!(
                run_case(&spec, &never),
                Err(HostError::TooFewCpus { .. })
            ));
            continue;
        }
        let r = run(&spec);
        if op == Op::CtxSwitch {
            assert_eq!(r.ops_per_rep % 2, 0, "two switches per round trip");
        }
        if op == Op::Fault {
            assert_eq!(r.ops_per_rep % spec.pages, 0, "`pages` pages per iteration");
            assert_eq!(r.unit, "page");
        }
        if op == Op::NullSyscall {
            assert!(
                r.median_us < 100.0,
                "a null syscall took {} µs",
                r.median_us
            );
        }
    }
}

#[test]
fn shootdown_cases_run_alone_and_with_siblings() {
    let _t = turn();
    let info = host();
    let with_sibling = info.online_cpu_count >= 2;
    let cases = [
        (Op::Madvise, 1),
        (Op::Madvise, 32),
        (Op::Mprotect, 8),
        (Op::Munmap, 1),
    ];
    for (op, pages) in cases {
        let alone = CaseSpec { pages, ..tiny(op) };
        assert_eq!(run(&alone).sibling_cpu_share, None);
        if !with_sibling {
            continue;
        }
        for mode in [SiblingMode::Busy, SiblingMode::Sleeping] {
            let spec = CaseSpec {
                siblings: 1,
                sibling_mode: mode,
                ..alone.clone()
            };
            let r = run(&spec);
            assert_eq!(r.cpus.len(), 2);
            let share = r.sibling_cpu_share.expect("sibling CPU share");
            if mode == SiblingMode::Sleeping {
                assert!(share < 0.5, "a sleeping sibling used {share} of its CPU");
            }
            if op == Op::Madvise && mode == SiblingMode::Busy {
                check_busy_sibling_is_shot_down(&spec, r);
            }
        }
    }
}

/// A busy sibling that had its CPU to itself gets (nearly) one shootdown IPI per madvise. When
/// other tasks take its CPU the mm is not loaded there for part of the time, so a contended
/// run is retried, and the check skipped if the host stays busy.
fn check_busy_sibling_is_shot_down(spec: &CaseSpec, first: CaseResult) {
    let mut r = first;
    for attempt in 0..5 {
        let share = r.sibling_cpu_share.unwrap_or(0.0);
        match r.tlb_ipis_per_op {
            None => return, // no TLB row on this host
            Some(tlb) if share >= 0.9 => {
                assert!(tlb >= 0.5, "madvise with a busy sibling: {tlb} TLB IPIs/op");
                return;
            }
            Some(tlb) if attempt == 4 => {
                eprintln!(
                    "skipped the TLB IPI check: the busy sibling got only {share:.2} of its CPU \
                     ({tlb:.2} TLB IPIs/op); the host is busy"
                );
                return;
            }
            Some(_) => r = run(spec),
        }
    }
}

#[test]
fn bad_specs_are_errors() {
    let _t = turn();
    let never = AtomicBool::new(false);
    let info = host();

    let too_many = CaseSpec {
        siblings: info.online_cpu_count,
        ..tiny(Op::Madvise)
    };
    let e = run_case(&too_many, &never).expect_err("siblings >= CPUs");
    assert!(matches!(e, HostError::TooFewCpus { .. }), "{e}");
    assert!(e.to_string().contains("online CPU"), "{e}");

    let zero_pages = CaseSpec {
        pages: 0,
        ..tiny(Op::Madvise)
    };
    assert!(matches!(
        run_case(&zero_pages, &never),
        Err(HostError::BadSpec(_))
    ));
    for bad in [
        CaseSpec {
            reps: 0,
            ..tiny(Op::NullSyscall)
        },
        CaseSpec {
            target_ms: 0.0,
            ..tiny(Op::NullSyscall)
        },
        CaseSpec {
            target_ms: f64::NAN,
            ..tiny(Op::NullSyscall)
        },
        CaseSpec {
            pages: 0,
            ..tiny(Op::Mprotect)
        },
    ] {
        assert!(
            matches!(run_case(&bad, &never), Err(HostError::BadSpec(_))),
            "{bad:?}"
        );
    }

    let e = CaseSpec::from_json(r#"{"op": "fork"}"#).expect_err("unknown op");
    assert!(e.to_string().contains("fork"), "{e}");
}

#[test]
fn json_specs() {
    let spec =
        CaseSpec::from_json(r#"{"op": "madvise", "pages": 32, "siblings": 1}"#).expect("valid");
    assert_eq!(spec.op, Op::Madvise);
    assert_eq!(spec.pages, 32);
    assert_eq!(spec.siblings, 1);
    assert_eq!(spec.sibling_mode, SiblingMode::Busy);
    assert_eq!(spec.reps, 5);
    assert_eq!(spec.target_ms, 30.0);

    let e = CaseSpec::from_json(r#"{"op": "madvise", "page": 32}"#).expect_err("typo");
    assert!(e.to_string().contains("page"), "{e}");
    assert!(serde_json::from_str::<CaseSpec>(r#"{"op": "munmap", "extra": 1}"#).is_err());

    for (op, name) in [
        (Op::NullSyscall, "null_syscall"),
        (Op::Fault, "fault"),
        (Op::CtxSwitch, "ctx_switch"),
        (Op::WakeIpi, "wake_ipi"),
        (Op::Migrate, "migrate"),
    ] {
        let text = serde_json::to_string(&CaseSpec::new(op)).expect("serialise");
        assert!(text.contains(&format!("\"op\":\"{name}\"")), "{text}");
        assert_eq!(CaseSpec::from_json(&text).expect("round trip").op, op);
        assert_eq!(op.name(), name);
    }
}

#[test]
fn cancel_is_prompt() {
    let _t = turn();
    let set = AtomicBool::new(true);
    let t0 = Instant::now();
    let e = run_case(&CaseSpec::new(Op::Madvise), &set).expect_err("cancelled");
    assert_eq!(e, HostError::Cancelled);
    assert!(t0.elapsed() < Duration::from_millis(200));

    // Cancelled mid-run: long reps, cancel after 60 ms, back within about one rep.
    let two = host().online_cpu_count >= 2;
    let ops: &[Op] = if two {
        &[Op::Madvise, Op::Munmap, Op::WakeIpi]
    } else {
        &[Op::Madvise, Op::CtxSwitch]
    };
    for &op in ops {
        let spec = CaseSpec {
            reps: 1000,
            target_ms: 20.0,
            siblings: usize::from(two && op.is_shootdown()),
            sibling_mode: SiblingMode::Sleeping,
            ..CaseSpec::new(op)
        };
        let cancel = AtomicBool::new(false);
        let t0 = Instant::now();
        let outcome = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(60));
                cancel.store(true, Ordering::Relaxed);
            });
            run_case(&spec, &cancel)
        });
        assert_eq!(
            outcome.expect_err("cancelled"),
            HostError::Cancelled,
            "{op:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(1000),
            "{op:?} took {:?} to cancel",
            t0.elapsed()
        );
    }
}

#[test]
fn probe_describes_the_host() {
    let info = host();
    assert!(info.online_cpus.windows(2).all(|w| w[0] < w[1]));
    let json = serde_json::to_value(&info).expect("serialise");
    for key in [
        "cpu_model",
        "online_cpus",
        "online_cpu_count",
        "sockets",
        "cores_per_socket",
        "threads_per_core",
        "kernel_release",
        "kernel_cmdline",
        "idle_poll",
        "mitigations",
        "pcid",
        "invpcid",
        "invlpgb",
        "hypervisor",
        "kvm_features",
        "interrupts_rows",
    ] {
        assert!(json.get(key).is_some(), "HostInfo JSON lacks {key}");
    }
    let back: HostInfo = serde_json::from_value(json).expect("deserialise");
    assert_eq!(back, info);
}
