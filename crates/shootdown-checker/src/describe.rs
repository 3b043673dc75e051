//! Counterexample step texts in kernel terms: every step of the model states its own text
//! (`Machine::describe`), so the explorer only asks for it.

use shootdown_engine::Model;
use shootdown_linux::{Action, Machine};

/// Describe `a` as it would execute from `m`, in kernel terms.
pub fn describe(m: &Machine, a: Action) -> String {
    m.describe(a)
}
