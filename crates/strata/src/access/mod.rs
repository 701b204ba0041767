//! Access methods.
