//! stripefs: a compact PVFS-style striped file system built only on ionet's public API.
