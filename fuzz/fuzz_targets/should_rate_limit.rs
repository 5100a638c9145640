//! `cellrate::fuzzing::should_rate_limit` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::should_rate_limit(data));
