//! Training data (being written).
