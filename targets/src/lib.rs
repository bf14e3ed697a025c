//! Device profiles (issue "memory promise").
