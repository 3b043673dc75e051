//! The generic explorer on toy models: exact state counts, shortest counterexamples, deadlock
//! detection, the state bound, and POR/symmetry soundness on the real scenarios.
mod common;
use common::*;
use shootdown_checker::explore::{explore, fingerprint, Limits, NoReduction, Reduction, Verdict};
use shootdown_checker::reduce::MachineReduction;
use shootdown_checker::{check_scenario, CheckOptions, Scenario};
use shootdown_engine::{Env, Model, Outcome, Time, Violation};
use shootdown_linux::{Action, Machine, MemoryModel};
use std::cell::RefCell;
use std::collections::HashSet;

/// Two agents each do `x = x + 1` as a load then a store; a state with both done and x != 2
/// violates "LOST-UPDATE". Optionally each takes locks in opposite order (deadlock).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Toy {
    x: u8,
    pc: [u8; 2],
    reg: [u8; 2],
    locks: [Option<usize>; 2],
    deadlocky: bool,
}

impl Model for Toy {
    type Action = usize;
    fn agents(&self) -> usize {
        2
    }
    fn enabled(&self, out: &mut Vec<usize>) {
        for a in 0..2 {
            if self.deadlocky {
                let want = match self.pc[a] {
                    0 => Some(a),
                    1 => Some(1 - a),
                    _ => None,
                };
                if let Some(l) = want {
                    if self.locks[l].is_none() {
                        out.push(a);
                    }
                }
            } else if self.pc[a] < 2 {
                out.push(a);
            }
        }
    }
    fn timed_action(&self, a: usize, _: Time) -> usize {
        a
    }
    fn agent_of(&self, a: usize) -> usize {
        a
    }
    fn apply<E: Env>(&mut self, a: usize, _: &mut E) -> Outcome {
        if self.deadlocky {
            let l = if self.pc[a] == 0 { a } else { 1 - a };
            self.locks[l] = Some(a);
        } else if self.pc[a] == 0 {
            self.reg[a] = self.x;
        } else {
            self.x = self.reg[a] + 1;
        }
        self.pc[a] += 1;
        Outcome::run()
    }
    fn describe(&self, a: usize) -> String {
        format!("agent {a} pc {}", self.pc[a])
    }
    fn agent_name(&self, a: usize) -> String {
        format!("t{a}")
    }
    fn finished(&self) -> bool {
        self.pc == [2, 2]
    }
    fn check_state(&self) -> Option<Violation> {
        (!self.deadlocky && self.finished() && self.x != 2).then(|| Violation {
            invariant: "LOST-UPDATE",
            detail: "x != 2".into(),
        })
    }
}

fn toy(deadlocky: bool) -> Toy {
    Toy {
        x: 0,
        pc: [0, 0],
        reg: [0, 0],
        locks: [None, None],
        deadlocky,
    }
}

#[test]
fn toy_lost_update_is_found_with_the_shortest_path() {
    let ex = explore(&toy(false), &NoReduction, Limits::default());
    assert_eq!(ex.verdict, Verdict::Violation);
    assert_eq!(ex.violation.unwrap().invariant, "LOST-UPDATE");
    assert_eq!(ex.path.len(), 4, "load, load, store, store");
    assert_eq!(ex.path[..2].iter().collect::<HashSet<_>>().len(), 2);
}

#[test]
fn toy_deadlock_is_x4() {
    let ex = explore(&toy(true), &NoReduction, Limits::default());
    assert_eq!(ex.verdict, Verdict::Violation);
    assert_eq!(ex.violation.unwrap().invariant, "X4-DEADLOCK");
    assert_eq!(ex.path.len(), 2, "each takes its first lock");
}

#[test]
fn toy_state_count_and_bound() {
    // Without the violation check: every state of the lost-update toy.
    let ex = explore(
        &toy(false),
        &NoReduction,
        Limits {
            max_states: 3,
            ..Limits::default()
        },
    );
    assert_eq!(ex.verdict, Verdict::BoundReached);
    assert_eq!(ex.states, 3);
}

/// Records the canonical (symmetry-reduced) fingerprint of every state a plain exploration sees.
struct Recording<'a> {
    sym: &'a MachineReduction,
    classes: RefCell<HashSet<u128>>,
}
impl Reduction<Machine> for Recording<'_> {
    fn fingerprint(&self, m: &Machine) -> u128 {
        self.classes.borrow_mut().insert(self.sym.fingerprint(m));
        fingerprint(m)
    }
}

/// Records the fingerprint of every state the symmetry-reduced exploration stores.
struct Stored<'a> {
    sym: &'a MachineReduction,
    fps: RefCell<HashSet<u128>>,
}
impl Reduction<Machine> for Stored<'_> {
    fn fingerprint(&self, m: &Machine) -> u128 {
        let f = self.sym.fingerprint(m);
        self.fps.borrow_mut().insert(f);
        f
    }
    fn images(&self, m: &Machine, a: Action, orders: &[Vec<usize>]) -> Vec<(Machine, Action)> {
        self.sym.images(m, a, orders)
    }
}

/// `name` with `groups` declared interchangeable.
fn with_groups(name: &str, groups: &[&[usize]]) -> Scenario {
    let mut sc = Scenario::load(&scenario(name)).unwrap();
    sc.file.symmetric = groups.iter().map(|g| g.to_vec()).collect();
    sc
}

/// The symmetry classes the full search reaches, and the classes the symmetry-reduced search
/// stores (neither with POR), with the number of those it reached through an image.
fn classes(sc: &Scenario, mem: MemoryModel) -> (HashSet<u128>, HashSet<u128>, u64) {
    let init = sc.build(None, mem).unwrap();
    let sym = MachineReduction::new(sc, true);
    assert!(sym.symmetric() && sym.asymmetry(&init).is_none());
    let no_por = Limits {
        por: false,
        ..Limits::default()
    };
    let rec = Recording {
        sym: &sym,
        classes: RefCell::new(HashSet::new()),
    };
    assert_eq!(explore(&init, &rec, no_por).verdict, Verdict::Verified);
    let stored = Stored {
        sym: &sym,
        fps: RefCell::new(HashSet::new()),
    };
    let reduced = explore(&init, &stored, no_por);
    assert_eq!(reduced.verdict, Verdict::Verified);
    (
        rec.classes.into_inner(),
        stored.fps.into_inner(),
        reduced.images,
    )
}

#[test]
fn symmetry_reduction_covers_every_class_the_model_reaches() {
    // The model is not CPU-rename-invariant: mm_cpumask is walked in CPU-id order, as
    // for_each_cpu does, and here cpu0 walks over cpu1 and cpu2. Without the images of the steps
    // that fix such an order, the reduced search stored 130,755 states against the 164,422
    // classes the full search reaches: it missed behaviour. With them it searches the model's
    // symmetric closure, a superset of every class the model reaches.
    let sc = with_groups("smp_call_remote_then_local", &[&[1, 2]]);
    let (full, reduced, images) = classes(&sc, MemoryModel::Sc);
    assert_eq!(full.len(), 164_422);
    assert!(images > 0);
    let missed = full.difference(&reduced).count();
    assert_eq!(missed, 0, "classes of the model the reduced search missed");
    // Here the closure adds no class: the model itself reaches every renaming of what the
    // images reach.
    assert_eq!(reduced.len(), 164_422);
}

#[test]
fn symmetry_reduction_is_exact_when_no_step_orders_a_group() {
    // Two flushers, each the other's only remote target: no walk orders them, no image is
    // needed, and the reduced search stores exactly the model's symmetry classes.
    let sc = Scenario::load(&scenario("symmetric_flushers")).unwrap();
    for mem in [MemoryModel::Sc, MemoryModel::Tso] {
        let (full, reduced, images) = classes(&sc, mem);
        assert_eq!(images, 0);
        assert_eq!(full, reduced);
    }
}

#[test]
fn symmetric_groups_must_be_interchangeable_after_setup() {
    let mut sc = with_groups("smp_call_concurrent", &[&[1, 2]]);
    check_scenario(&sc, None, MemoryModel::Sc, CheckOptions::default()).unwrap();
    sc.file.setup.push(shootdown_checker::scenario::SetupSpec {
        cpu: 1,
        steps: Some(1),
        until: None,
    });
    let e = check_scenario(&sc, None, MemoryModel::Sc, CheckOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("symmetric") && e.to_string().contains("not interchangeable"),
        "{e}"
    );
}

/// Groups of CPUs whose tasks run the same programs in the same mms: the groups a scenario
/// could declare `symmetric`.
fn alike_cpus(sc: &Scenario) -> Vec<Vec<usize>> {
    let f = &sc.file;
    let role = |c: usize| -> Vec<String> {
        f.tasks
            .iter()
            .filter(|t| t.cpu == c)
            .map(|t| format!("{:?}{:?}", t.mm, t.program))
            .collect()
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for c in 0..f.cpus {
        if role(c).is_empty() {
            continue;
        }
        match groups.iter_mut().find(|g| role(g[0]) == role(c)) {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    groups.retain(|g| g.len() > 1);
    groups
}

#[test]
fn symmetry_keeps_every_verdict_and_counterexample_length() {
    // Every scenario with CPUs that are or could be declared interchangeable (not the KVM MMU
    // ones, whose state is not renamed), its fixed protocol and each of its mutants, under SC
    // and TSO: the verdict, the invariant and the counterexample's length are the same with
    // and without symmetry reduction, with and without POR. Spaces beyond 210,000 states are
    // left out (the searches would only reach the bound).
    let mut compared = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(scenarios())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let mut sc = Scenario::load(&path).unwrap();
        if sc.file.kvm.is_some() {
            continue;
        }
        if sc.file.symmetric.is_empty() {
            sc.file.symmetric = alike_cpus(&sc);
        }
        if sc.file.symmetric.is_empty() {
            continue;
        }
        let init = sc.build(None, MemoryModel::Sc).unwrap();
        if MachineReduction::new(&sc, true).asymmetry(&init).is_some() {
            continue; // their setup leaves them different
        }
        let mutants: Vec<Option<String>> = std::iter::once(None)
            .chain(sc.file.mutants.iter().map(|m| Some(m.name.clone())))
            .collect();
        for mutant in &mutants {
            for mem in [MemoryModel::Sc, MemoryModel::Tso] {
                let mut seen = Vec::new();
                for (por, symmetry) in [(true, false), (true, true), (false, true)] {
                    let r = check_scenario(
                        &sc,
                        mutant.as_deref(),
                        mem,
                        CheckOptions {
                            por,
                            symmetry,
                            max_states: Some(210_000),
                            ..CheckOptions::default()
                        },
                    )
                    .unwrap();
                    seen.push((r.verdict, r.invariant, r.counterexample.len()));
                    if seen[0].0 == "bound-reached" {
                        break;
                    }
                }
                if seen.iter().any(|s| s.0 == "bound-reached") {
                    continue;
                }
                assert!(
                    seen.windows(2).all(|w| w[0] == w[1]),
                    "{} {mutant:?} {mem:?}: {seen:?}",
                    sc.name
                );
                compared.push(format!("{} {mutant:?} {mem:?}: {}", sc.name, seen[0].0));
            }
        }
    }
    eprintln!("{}", compared.join("\n"));
    assert!(compared.len() >= 10, "{compared:?}");
}

#[test]
fn renaming_commutes_with_every_step_that_fixes_no_order() {
    // For every reachable state s, action a and renaming π of the group: unless a fixed an
    // order over CPUs (Env::cpu_order), applying π(a) to π(s) gives exactly π(a(s)). This is
    // what makes merging renamed states sound, and it checks that Machine::permute_cpus renames
    // everything that names a CPU (a placeholder renamed, a lock holder not renamed, … break it).
    let cases: &[(&str, &[usize], MemoryModel)] = &[
        ("symmetric_flushers", &[0, 1], MemoryModel::Sc),
        ("symmetric_flushers", &[0, 1], MemoryModel::Tso),
        ("smp_call_remote_then_local", &[1, 2], MemoryModel::Sc),
        ("pv_tlb_flush_3vcpu", &[1, 2, 3], MemoryModel::Sc),
    ];
    for &(name, group, mem) in cases {
        let sc = with_groups(name, &[group]);
        let init = sc.build(None, mem).unwrap();
        let red = MachineReduction::new(&sc, true);
        let mut env = shootdown_checker::explore::ExploreEnv::default();
        let mut seen = HashSet::new();
        let mut queue = std::collections::VecDeque::from([init]);
        let (mut checked, mut ordered) = (0u64, 0u64);
        // The first 15,000 states of each space.
        while let (Some(s), true) = (queue.pop_front(), seen.len() < 15_000) {
            let mut en = Vec::new();
            s.enabled(&mut en);
            for a in en {
                let mut t = s.clone();
                if t.apply(a, &mut env).violation.is_some() {
                    continue;
                }
                if env.take_orders().is_empty() {
                    let want = red.renamings(&t, a);
                    for (i, (mut u, pa)) in red.renamings(&s, a).into_iter().enumerate() {
                        u.apply(pa, &mut env);
                        env.take_orders();
                        assert_eq!(
                            fingerprint(&u),
                            fingerprint(&want[i].0),
                            "{name}: {} does not commute with renaming {i}",
                            s.describe(a)
                        );
                        checked += 1;
                    }
                } else {
                    ordered += 1;
                }
                if seen.insert(fingerprint(&t)) {
                    queue.push_back(t);
                }
            }
        }
        assert!(checked > 10_000, "{name}: {checked}");
        assert_eq!(ordered > 0, name != "symmetric_flushers", "{name}");
    }
}

#[test]
fn local_steps_are_really_local() {
    // Whenever the model calls a step local, it must commute with every other CPU's enabled
    // action (checked on every state of two scenarios, SC and TSO).
    for (name, mm) in [
        ("switch_mm_flush", MemoryModel::Tso),
        ("flush_catchup", MemoryModel::Sc),
    ] {
        let sc = Scenario::load(&scenario(name)).unwrap();
        let init = sc.build(None, mm).unwrap();
        let mut seen = HashSet::new();
        let mut stack = vec![init];
        let mut checked = 0;
        let mut env = shootdown_checker::explore::ExploreEnv::default();
        while let Some(s) = stack.pop() {
            if !seen.insert(fingerprint(&s)) || seen.len() > 20_000 {
                continue;
            }
            let mut en = Vec::new();
            s.enabled(&mut en);
            for &a in &en {
                if let Action::Step(c) = a {
                    if s.step_is_local(c as usize) {
                        for &b in &en {
                            if s.agent_of(b) == c as usize {
                                continue;
                            }
                            let mut ab = s.clone();
                            assert!(ab.apply(a, &mut env).violation.is_none());
                            let mut en2 = Vec::new();
                            ab.enabled(&mut en2);
                            assert!(en2.contains(&b), "{a:?} disabled {b:?}");
                            ab.apply(b, &mut env);
                            let mut ba = s.clone();
                            ba.apply(b, &mut env);
                            let mut en3 = Vec::new();
                            ba.enabled(&mut en3);
                            assert!(en3.contains(&a), "{b:?} disabled local {a:?}");
                            ba.apply(a, &mut env);
                            assert!(ab == ba, "{name}: {a:?} and {b:?} do not commute");
                            checked += 1;
                        }
                    }
                }
            }
            for &a in &en {
                let mut t = s.clone();
                t.apply(a, &mut env);
                stack.push(t);
            }
        }
        assert!(checked > 0, "{name}: no local step seen");
    }
}
