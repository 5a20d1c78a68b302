//! Memory planning (see issue 3).
