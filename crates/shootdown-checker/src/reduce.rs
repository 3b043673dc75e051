//! The reductions the explorer applies to `shootdown_linux::Machine`.
//!
//! **Partial-order reduction.** In a state where some CPU's next `Step` is *local*
//! ([`Machine::step_is_local`]: interrupts off, touches only that CPU's private state, never the
//! TLB, page tables or oracle, never spins), `{Step(cpu)}` is a persistent set: no sequence of
//! other actions can enable an action that conflicts with it, and it cannot report a violation.
//! The explorer then expands only that action (if its successor is new; see `explore.rs` for the
//! cycle proviso). The lowest such CPU is chosen, so the choice is deterministic.
//!
//! **Symmetry reduction** (on by default). A scenario may declare groups of interchangeable
//! CPUs (same tasks, same programs; whatever setup they run must leave them interchangeable,
//! which [`MachineReduction::asymmetry`] checks on the initial state). The fingerprint of a state
//! is then the smallest fingerprint over all renamings of the CPUs inside each group
//! ([`Machine::permute_cpus`], which also renames their tasks, cpumask bits, csds,
//! store-buffer locations, vCPUs and pCPUs…).
//!
//! Merging a state with its renamings is exact only if the model is rename-invariant, and the
//! kernel is not: `for_each_cpu` visits `mm_cpumask` in CPU-id order, so after a renaming the
//! flusher visits two CPUs of a group in the other order. The model reports each such order
//! when it fixes it ([`shootdown_engine::Env::cpu_order`]; a walk in progress is a list of CPUs,
//! which renames like any other state). Where a step ordered two CPUs of a group,
//! [`MachineReduction::images`] also expands the same step from the renamed copies of the state
//! that order them the other way. The search is then one of the model's *symmetric closure*:
//! every state of the model, up to renaming, and possibly more (a renamed state may not be
//! reachable itself). So:
//!
//! * `verified` is sound: the closure holds every behaviour of the model;
//! * a violation whose path uses no image is a run of the model, and breadth-first search
//!   still finds a shortest one (the closure's shortest path to a violating class is no longer
//!   than the model's, and this one is the model's);
//! * a violation through an image is only a candidate: `lib.rs` checks again without symmetry,
//!   so every counterexample printed is one of the model and of the shortest length.
//!
//! Where no step ever orders two CPUs of a group the closure is the model itself and the
//! reduction is exact (tests compare the symmetry classes of the full search with the states of
//! the reduced one).

use crate::explore::{fingerprint, Reduction};
use crate::scenario::Scenario;
use shootdown_linux::{Action, Machine};

/// Whether `a` is a CPU's local step: a persistent set on its own (module documentation).
fn is_local(m: &Machine, a: Action) -> bool {
    match a {
        Action::Step(c) => m.step_is_local(c as usize),
        _ => false,
    }
}

/// A renaming of the CPUs (and with them their tasks) within the declared groups.
struct Perm {
    cpus: Vec<usize>,
    tasks: Vec<u32>,
}

pub struct MachineReduction {
    groups: Vec<Vec<usize>>,
    /// Every renaming of the declared groups except the identity.
    perms: Vec<Perm>,
}

fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let x = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, x);
            out.push(p);
        }
    }
    out
}

impl MachineReduction {
    pub fn new(sc: &Scenario, symmetry: bool) -> Self {
        let groups: Vec<Vec<usize>> = if symmetry {
            sc.symmetric_groups().to_vec()
        } else {
            Vec::new()
        };
        let mut perms = Vec::new();
        if !groups.is_empty() {
            let n = sc.file.cpus;
            let tasks = sc.tasks_of_cpu();
            let nt = n + sc.file.tasks.len();
            // Cartesian product of the permutations of each group.
            let mut cpu_perms: Vec<Vec<usize>> = vec![(0..n).collect()];
            for g in &groups {
                let mut next = Vec::new();
                for base in &cpu_perms {
                    for p in permutations(g) {
                        let mut q = base.clone();
                        for (k, &c) in g.iter().enumerate() {
                            q[c] = p[k];
                        }
                        next.push(q);
                    }
                }
                cpu_perms = next;
            }
            for cp in cpu_perms {
                if cp.iter().enumerate().all(|(i, &c)| i == c) {
                    continue;
                }
                let mut tp: Vec<u32> = (0..nt as u32).collect();
                for c in 0..n {
                    tp[c] = cp[c] as u32; // idle task c is task c
                    for (k, &t) in tasks[c].iter().enumerate() {
                        tp[t as usize] = tasks[cp[c]][k];
                    }
                }
                perms.push(Perm {
                    cpus: cp,
                    tasks: tp,
                });
            }
        }
        MachineReduction { groups, perms }
    }

    /// Whether symmetry is in effect.
    pub fn symmetric(&self) -> bool {
        !self.perms.is_empty()
    }

    /// Why the declared groups are not interchangeable in `init` (the state after setup), if
    /// they are not: the symmetric closure of the model would then start from states the model
    /// never reaches. Compared whole, not by fingerprint: a fingerprint leaves out what is
    /// fixed for a run (programs, configuration), and renaming must leave that alike too.
    pub fn asymmetry(&self, init: &Machine) -> Option<String> {
        self.perms
            .iter()
            .find(|p| init.permute_cpus(&p.cpus, &p.tasks) != *init)
            .map(|p| {
                let moved: Vec<String> = (0..p.cpus.len())
                    .filter(|&c| p.cpus[c] != c)
                    .map(|c| format!("cpu{c}"))
                    .collect();
                format!(
                    "{} are not interchangeable after setup (their state differs); declare only CPUs whose setup leaves them alike",
                    moved.join(", ")
                )
            })
    }

    /// Every renaming `(π(m), π(a))` of a state and an action, one per permutation of the
    /// groups other than the identity, always in the same order.
    pub fn renamings(&self, m: &Machine, a: Action) -> Vec<(Machine, Action)> {
        self.renamings_where(m, a, |_| true)
    }

    fn renamings_where(
        &self,
        m: &Machine,
        a: Action,
        keep: impl Fn(&[usize]) -> bool,
    ) -> Vec<(Machine, Action)> {
        self.perms
            .iter()
            .filter(|p| keep(&p.cpus))
            .map(|p| (m.permute_cpus(&p.cpus, &p.tasks), rename_action(a, &p.cpus)))
            .collect()
    }

    /// Whether a step's CPU orders put two CPUs of one group in an order.
    fn orders_a_group(&self, orders: &[Vec<usize>]) -> bool {
        orders.iter().any(|o| {
            self.groups
                .iter()
                .any(|g| o.iter().filter(|c| g.contains(c)).count() > 1)
        })
    }
}

/// `a` with its CPU renamed by `perm`.
fn rename_action(a: Action, perm: &[usize]) -> Action {
    let r = |c: u32| perm[c as usize] as u32;
    match a {
        Action::Step(c) => Action::Step(r(c)),
        Action::Interrupt(c) => Action::Interrupt(r(c)),
        Action::Drain(c) => Action::Drain(r(c)),
        Action::Fill(c, page) => Action::Fill(r(c), page),
        Action::VcpuPut(v) => Action::VcpuPut(r(v)),
        Action::VcpuIoctl(v) => Action::VcpuIoctl(r(v)),
        Action::HostIrq(v) => Action::HostIrq(r(v)),
        Action::PleExit(v) => Action::PleExit(r(v)),
        Action::Nmi(c) => Action::Nmi(r(c)),
        Action::Tick(c) => Action::Tick(r(c)),
    }
}

/// Whether `perm` keeps the relative order of the CPUs of `order` (then the renamed state's
/// walk is the renamed walk, and its successor adds nothing).
fn keeps_order(perm: &[usize], orders: &[Vec<usize>]) -> bool {
    orders
        .iter()
        .all(|o| o.windows(2).all(|w| perm[w[0]] < perm[w[1]]))
}

impl Reduction<Machine> for MachineReduction {
    fn fingerprint(&self, m: &Machine) -> u128 {
        let mut best = fingerprint(m);
        for p in &self.perms {
            best = best.min(fingerprint(&m.permute_cpus(&p.cpus, &p.tasks)));
        }
        best
    }

    fn persistent_singleton(&self, m: &Machine, enabled: &[Action]) -> Option<Action> {
        enabled.iter().copied().find(|&a| is_local(m, a))
    }

    fn persistent_candidates(&self, m: &Machine, enabled: &[Action], out: &mut Vec<Action>) {
        out.extend(enabled.iter().copied().filter(|&a| is_local(m, a)));
    }

    fn images(&self, m: &Machine, a: Action, orders: &[Vec<usize>]) -> Vec<(Machine, Action)> {
        if !self.orders_a_group(orders) {
            return Vec::new();
        }
        self.renamings_where(m, a, |p| !keeps_order(p, orders))
    }
}
