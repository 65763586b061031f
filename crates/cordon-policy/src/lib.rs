//! Policy: the policy file, per-call Cedar rules, sequence automata and
//! attenuated capabilities. Pure: no I/O happens here.
#![forbid(unsafe_code)]
