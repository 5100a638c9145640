//! The Redis protocol side of cellrate (issue #19, under way): `CL.THROTTLE` as redis-cell
//! answers it. So far the arithmetic ([`throttle`]); the listener comes next.

pub mod throttle;
