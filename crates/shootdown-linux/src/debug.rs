//! Diagnostic dumps of a machine (`SHOOTDOWN_DUMP=1` on a deadlock; tests).

use crate::machine::Machine;

impl Machine {
    /// A human-readable snapshot of every CPU (stacks, pending IPIs, queues): for diagnosing a
    /// deadlock or a violation.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for (i, c) in self.cpus.iter().enumerate() {
            let t = &self.tasks[c.curr as usize];
            let frames: Vec<String> = t
                .stack
                .iter()
                .map(|f| format!("{}@{}", f.name(), f.step_name()))
                .collect();
            let irq: Vec<String> = c
                .irq_stack
                .iter()
                .map(|f| format!("{}@{}", f.name(), f.step_name()))
                .collect();
            s += &format!(
                "cpu{i}: task={} state={:?} stack={frames:?} irq={irq:?} ipi_pending={} irqs_on={} queue={:?} rq={:?} halted={} loaded_mm={} lazy={}\n",
                t.name, t.state, c.ipi_pending, self.irqs_enabled(i), c.call_queue, c.runqueue, c.halted, c.tlbstate.loaded_mm, c.tlbstate.is_lazy
            );
        }
        s += &format!(
            "csd_locked={:?}\n",
            self.csd_locked.iter().collect::<Vec<_>>()
        );
        if let Some(h) = &self.host {
            for (v, vc) in h.vcpus.iter().enumerate() {
                let frames: Vec<String> = vc
                    .stack
                    .iter()
                    .map(|f| format!("{}@{}", f.name(), f.step_name()))
                    .collect();
                s += &format!(
                    "vcpu{v}: thread={:?} mode={} requests={:#x} kicks={:?} irqs_off={} host stack={frames:?}\n",
                    vc.thread, vc.mode, vc.requests, vc.kicks, vc.irqs_off
                );
            }
            for (vm, k) in h.kvms.iter().enumerate() {
                if let Some(k) = &**k {
                    s += &format!(
                        "vm{vm}: mmu_lock={} queue={:?} rwlock cnts={:#x} wait_lock={} queue={:?} invalidate in progress={}\n",
                        k.mmu_lock.val, k.mmu_lock.queue, k.mmu_rwlock.cnts, k.mmu_rwlock.wait_lock.val,
                        k.mmu_rwlock.wait_lock.queue, k.mmu_notifier_count
                    );
                }
            }
        }
        s
    }
}
