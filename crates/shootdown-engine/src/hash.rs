//! [`hash_by_fields!`]: `Hash` for a model-state struct that leaves out the fields fixed for a
//! whole run. The explorer fingerprints every successor it builds, most of them to find it
//! visited; hashing a machine's options, topology, task programs and names again each time
//! cost about a fifth of the fingerprint and can never tell two states of one run apart.

/// Implement `Hash` for struct `$ty`: the fields listed first are hashed in order; those after
/// `fixed` are not.
///
/// A field may be listed as fixed only if no step ever writes it: it is set when the machine
/// is built (or renamed with everything else by the checker's symmetry reduction, which
/// requires the renamed initial state to *equal* the initial state). Two states of one run then
/// always agree on it. Both lists together must name every field: the destructuring pattern
/// the macro generates is exhaustive, so a new field is a compile error until it is classified.
#[macro_export]
macro_rules! hash_by_fields {
    ($ty:ident { $($f:ident),* $(,)? } fixed { $($x:ident),* $(,)? }) => {
        impl ::std::hash::Hash for $ty {
            #[inline]
            fn hash<H: ::std::hash::Hasher>(&self, state: &mut H) {
                let $ty { $($f,)* $($x: _,)* } = self;
                $(::std::hash::Hash::hash($f, state);)*
            }
        }
    };
}

/// The usual declaration of a state struct: [`clone_by_fields!`](crate::clone_by_fields) over
/// every field and [`hash_by_fields!`] over the hashed ones, from one list.
#[macro_export]
macro_rules! state_fields {
    ($ty:ident { $($f:ident),* $(,)? } fixed { $($x:ident),* $(,)? }) => {
        $crate::clone_by_fields!($ty { $($f,)* $($x,)* });
        $crate::hash_by_fields!($ty { $($f,)* } fixed { $($x,)* });
    };
}
