//! Credit-based flow control and server buffer zones (sans-IO). See DESIGN §6.
