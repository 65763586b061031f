//! persist
