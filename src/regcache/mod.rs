//! Pin-down (memory registration) cache over a `Registrar` trait. See DESIGN §5.
