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
        s += &format!("csd_locked={:?}\n", self.csd_locked.iter().collect::<Vec<_>>());
        s
    }
}
