//! The `Verbs` trait: the one seam between the IB engine and a provider.
