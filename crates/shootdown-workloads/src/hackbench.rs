//! hackbench (Rusty Russell and Ingo Molnar's scheduler benchmark, as rt-tests ships it:
//! `src/hackbench/hackbench.c`): `groups` groups of `fds` receivers and `fds` senders. Each
//! receiver has its own pipe (hackbench's `-p`; by default a unix socketpair, a stream with a
//! bounded buffer just the same); every sender writes `loops` rounds of one message of
//! `datasize` bytes to each receiver of its group, and each receiver reads `fds × loops`
//! messages. In process mode (the default) every task is a process of its own, so a CPU that
//! switches from a blocked receiver to a sender switches mms (`switch_mm_irqs_off`, lazy TLB,
//! `mm_cpumask`); with `mode = "threads"` they are threads of one process. Metric: hackbench's
//! time, from the start until every task has exited.
//!
//! Assumptions (say so where they matter):
//! * task `i` (the receivers of a group, then its senders, group after group) runs on CPU
//!   `i mod cpus` and stays there: the model's scheduler does no load balancing, where the
//!   kernel's spreads and migrates hackbench's tasks;
//! * the tasks start together (hackbench's ready/wake pipes are left out);
//! * a pipe holds `capacity` messages: 655 of 100 bytes is a 64 KiB pipe (a unix socket's
//!   default send buffer holds about three times as many);
//! * the copy of a message's 100 bytes costs nothing beyond the pipe's line.

use crate::{params::limits, Built, Measure, ParamError, Params};
use shootdown_engine::Time;
use shootdown_linux::{Machine, UserOp};

pub fn build(p: &Params, mut m: Machine) -> Result<Built, ParamError> {
    let groups = p.int("groups", 10, 1..=limits::COUNT)? as usize;
    let fds = p.int("fds", 20, 1..=limits::THREADS)? as usize;
    let loops = p.int("loops", 100, 1..=limits::COUNT)? as u32;
    let threads = p.string("mode", "process", &["process", "threads"])? == "threads";
    let capacity = p.int("capacity", 655, 1..=limits::COUNT)? as u32;
    let cpus = p.int("cpus", m.cpus.len() as i64, 1..=m.cpus.len() as i64)? as usize;
    if groups * fds * 2 > limits::THREADS as usize {
        return Err((
            "groups".into(),
            format!(
                "{} tasks is more than {}",
                groups * fds * 2,
                limits::THREADS
            ),
        ));
    }
    let shared_mm = threads.then(|| m.add_mm("hackbench"));
    let mut next_cpu = 0;
    let mut place = |m: &mut Machine, name: String, prog: Vec<UserOp>| {
        let mm = shared_mm.unwrap_or_else(|| m.add_mm(&name));
        m.add_task(&name, mm, next_cpu % cpus, prog);
        next_cpu += 1;
    };
    for g in 0..groups {
        let pipes: Vec<u32> = (0..fds).map(|_| m.add_pipe(capacity)).collect();
        for (r, &pipe) in pipes.iter().enumerate() {
            let prog = vec![
                UserOp::PipeRead { pipe },
                UserOp::Loop {
                    to: 0,
                    times: Some(fds as u32 * loops - 1),
                },
                UserOp::Exit,
            ];
            place(&mut m, format!("receiver{g}.{r}"), prog);
        }
        for s in 0..fds {
            let mut prog: Vec<UserOp> = pipes
                .iter()
                .map(|&pipe| UserOp::PipeWrite { pipe })
                .collect();
            prog.push(UserOp::Loop {
                to: 0,
                times: Some(loops - 1),
            });
            prog.push(UserOp::Exit);
            place(&mut m, format!("sender{g}.{s}"), prog);
        }
    }
    Ok(Built {
        machine: m,
        measure: Measure::CompletionSeconds,
        max_time: Time::from_ms(600_000),
    })
}
