//! `cordon run`: the escape-attempt suite, resource attacks, positive controls, refusals and
//! evidence. Tests that need root skip with a printed reason when not run as root; CI sets
//! `CORDON_REQUIRE_PRIVILEGED=1`, which turns such a skip into a failure.

mod support;

mod contain;
mod escape;
mod lifecycle;
mod resources;
