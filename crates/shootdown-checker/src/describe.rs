//! Counterexample step texts in kernel terms: every step of the model states its own text
//! (`Machine::describe`), so the explorer only asks for it.

use shootdown_engine::Model;
use shootdown_linux::{Action, Machine};

/// Describe `a` as it would execute from `m`, in kernel terms.
pub fn describe(m: &Machine, a: Action) -> String {
    m.describe(a)
}

/// The text of a step: its own description, or — where a step says nothing — the action
/// itself, so that no step of a counterexample is blank.
pub fn step_text(m: &Machine, a: Action) -> String {
    let text = describe(m, a);
    if text.trim().is_empty() {
        format!("{a:?}")
    } else {
        text
    }
}
