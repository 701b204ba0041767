//! Operators.
