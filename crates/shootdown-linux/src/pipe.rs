//! fs/pipe.c, as far as a benchmark's tasks block on each other (hackbench's senders and
//! receivers): a pipe holds up to `capacity` messages; `read()` of an empty pipe sleeps until a
//! writer wakes it, `write()` to a full one sleeps until a reader makes room
//! (`pipe_read()` / `pipe_write()` with `pipe->rd_wait` / `pipe->wr_wait`). Each sleep is a
//! schedule() to whatever else the CPU has, so tasks of different processes switch mms
//! (`switch_mm_irqs_off`, lazy TLB, `mm_cpumask`).
//!
//! Simplified: a message is one unit of the pipe's capacity (hackbench writes and reads whole
//! messages of `datasize` bytes, so partial reads never happen at its defaults); each call pays a
//! system call, the pipe's line (its `mutex`, ring indices and the data written into it) moving
//! from the last CPU that used the pipe, and a wake-up of a sleeper if there is one. Only the
//! timed driver's workloads use pipes; no checker scenario declares one.

use crate::machine::Machine;
use crate::mem::pipe_line;
use crate::state::{TaskId, TaskState};
use shootdown_engine::Env;
use shootdown_hw::CpuId;

/// One pipe (or, as hackbench uses it by default, a unix socketpair: a stream with a bounded
/// buffer).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pipe {
    /// Messages written and not yet read.
    pub msgs: u32,
    /// How many fit (`pipe->max_usage` slots, or the socket's send buffer, in messages).
    pub capacity: u32,
    /// Tasks asleep in `read()` / `write()` on it (`rd_wait`, `wr_wait`).
    pub readers: Vec<TaskId>,
    pub writers: Vec<TaskId>,
}

impl Machine {
    /// A new pipe holding up to `capacity` messages; returns its number (for
    /// [`crate::UserOp::PipeWrite`] and [`crate::UserOp::PipeRead`]).
    pub fn add_pipe(&mut self, capacity: u32) -> u32 {
        self.pipes.push(Pipe {
            capacity: capacity.max(1),
            ..Pipe::default()
        });
        (self.pipes.len() - 1) as u32
    }

    /// `write()` of one message to `pipe` by task `t` on `cpu` (`pipe_write()`): sleeps while
    /// the pipe is full, then wakes a sleeping reader.
    pub(crate) fn pipe_write<E: Env>(&mut self, cpu: CpuId, t: usize, pipe: u32, env: &mut E) {
        if !self.pipe_enter(cpu, t, pipe, env) {
            return;
        }
        let p = &mut self.pipes[pipe as usize];
        if p.msgs >= p.capacity {
            p.writers.push(t as TaskId);
            self.say(|| format!("write(pipe {pipe}): full, sleep on wr_wait"));
            self.pipe_sleep(cpu, t, env);
            return;
        }
        p.msgs += 1;
        let woken = (!p.readers.is_empty()).then(|| p.readers.remove(0));
        self.tasks[t].pc += 1;
        self.say(|| format!("write(pipe {pipe}): one message"));
        if let Some(r) = woken {
            self.wake_up_process(cpu, r, env);
        }
    }

    /// `read()` of one message from `pipe` by task `t` on `cpu` (`pipe_read()`): sleeps while
    /// the pipe is empty, then wakes a writer waiting for room.
    pub(crate) fn pipe_read<E: Env>(&mut self, cpu: CpuId, t: usize, pipe: u32, env: &mut E) {
        if !self.pipe_enter(cpu, t, pipe, env) {
            return;
        }
        let p = &mut self.pipes[pipe as usize];
        if p.msgs == 0 {
            p.readers.push(t as TaskId);
            self.say(|| format!("read(pipe {pipe}): empty, sleep on rd_wait"));
            self.pipe_sleep(cpu, t, env);
            return;
        }
        p.msgs -= 1;
        let woken = (!p.writers.is_empty()).then(|| p.writers.remove(0));
        self.tasks[t].pc += 1;
        self.say(|| format!("read(pipe {pipe}): one message"));
        if let Some(w) = woken {
            self.wake_up_process(cpu, w, env);
        }
    }

    /// The call's entry (a system call, unless the task is back from sleeping inside it) and
    /// the pipe's line; false if there is no such pipe (the op is skipped).
    fn pipe_enter<E: Env>(&mut self, cpu: CpuId, t: usize, pipe: u32, env: &mut E) -> bool {
        if pipe as usize >= self.pipes.len() {
            self.tasks[t].pc += 1;
            return false;
        }
        if self.tasks[t].op_base.take().is_none() {
            self.charge(env, |c| c.syscall_entry_exit);
        }
        self.touch_line(env, cpu, pipe_line(pipe), true);
        true
    }

    /// Sleep inside the call (`TASK_INTERRUPTIBLE`, then `schedule()`); the op runs again when
    /// the task is woken, without a second system call.
    fn pipe_sleep<E: Env>(&mut self, cpu: CpuId, t: usize, env: &mut E) {
        self.tasks[t].state = TaskState::Blocked;
        self.tasks[t].op_base = Some(0);
        let f = self.schedule_frame();
        self.call(cpu, env, f);
    }
}
