//! Dtype and shape inference (placeholder; filled in below).
