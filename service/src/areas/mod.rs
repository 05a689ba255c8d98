//! The areas' calls, one module per area of the replicated state: what a
//! call of the area does — the journal command it proposes, what it waits
//! for, what it reads — whichever dialect it came in. Areas run their calls
//! through the core and never call each other.

pub mod closures;
pub mod coordination;
pub mod dispatcher;
pub mod rendezvous;
pub mod torch;
