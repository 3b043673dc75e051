//! The timed driver's prefetch hints (`Model::prefetch`): while the earliest agent steps, the
//! memory the next agents' steps will read — a CPU's `struct Cpu`, its current task, its top
//! frame ([`crate::perf::FrameHint`]) and what the frame's walk over other CPUs reads next — is
//! fetched ahead. Hints only: nothing here changes a result. Model machinery (the simulator's
//! own cache misses), not a kernel concept.

use crate::machine::Machine;
use crate::mem::{call_queue_line, csd_line, flush_info_line, percpu_line, PerCpuLine};
use crate::perf::Peer;
use crate::state::{Cpu, CsdKey, Task};
use shootdown_engine::{prefetch, Lead};
use shootdown_hw::CpuId;

impl Machine {
    /// Two steps ahead: the CPU's first lines (what `timed_action` and the stack code read
    /// first), its performance line and its frame hint. One step ahead: through the CPU, now
    /// cached, its current task; through the hint its last step left
    /// ([`crate::perf::FrameHint`]), its top frame (of the interrupt stack, else of the
    /// task's) and what the frame's walk over other CPUs reads next. (The interrupt stack's
    /// top was also fetched through the CPU, a load the hint already answers: 4 % slower.)
    #[inline]
    pub(crate) fn prefetch_ahead(&self, agent: usize, lead: Lead) {
        let Some(c) = self.cpus.get(agent) else {
            return;
        };
        match lead {
            Lead::Two => {
                let p: *const Cpu = &**c;
                prefetch(p);
                prefetch(p.cast::<u8>().wrapping_add(64));
                prefetch(&self.perf.cpu[agent]);
                if let Some(h) = self.perf.frames.get(agent) {
                    prefetch(h);
                }
                let lines = &self.perf.lines;
                lines.prefetch(percpu_line(agent, PerCpuLine::Tlbstate0));
                lines.prefetch(percpu_line(agent, PerCpuLine::CallQueue));
            }
            Lead::One => {
                if let Some(t) = self.tasks.get(c.curr as usize) {
                    let p: *const Task = &**t;
                    prefetch(p);
                }
                // The hint's line is cached: it was fetched two steps ahead.
                if let Some(h) = self.perf.frames.get(agent) {
                    h.prefetch();
                    if let Some(peer) = h.peer.get() {
                        self.prefetch_peer(agent, peer);
                    }
                }
            }
        }
    }

    /// What `agent`'s next step reads about `peer` ([`crate::perf::FrameHint`]): a target's
    /// `struct Cpu` (its `call_single_queue` in the first line, `cpu_tlbstate` in the next
    /// two) and the directory's entries for its lines, or a sender's `flush_tlb_info`; and
    /// their csd's lock bit and line.
    fn prefetch_peer(&self, agent: CpuId, peer: Peer) {
        let n = self.cpus.len();
        let lines = &self.perf.lines;
        let k = match peer {
            Peer::Target(t) => {
                let Some(c) = self.cpus.get(t) else { return };
                let p: *const Cpu = &**c;
                for off in [0, 64, 128] {
                    prefetch(p.cast::<u8>().wrapping_add(off));
                }
                // What cond_func reads (`loaded_mm`, and `is_lazy` in either of the lines it
                // has had; `line_of` is a match over every location, too slow here), then
                // llist_add's line.
                for kind in [PerCpuLine::Tlbstate0, PerCpuLine::TlbstateShared] {
                    // Every flushing CPU reads these lines: the bit that says whether
                    // `agent` holds a copy is in a word of its own.
                    lines.prefetch(percpu_line(t, kind));
                    lines.prefetch_sharer(percpu_line(t, kind), agent);
                }
                lines.prefetch(call_queue_line(t));
                CsdKey { src: agent, dst: t }
            }
            Peer::Sender(s) => {
                let Some(info) = self.flush_info.get(s) else {
                    return;
                };
                prefetch(info);
                lines.prefetch(flush_info_line(s));
                lines.prefetch_sharer(flush_info_line(s), agent);
                CsdKey { src: s, dst: agent }
            }
        };
        if k.src < n && k.dst < n {
            lines.prefetch(csd_line(n, k));
            self.csd_locked.prefetch(k);
        }
    }
}
