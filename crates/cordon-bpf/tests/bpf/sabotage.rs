//! sabotage
