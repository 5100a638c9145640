//! `cellrate::fuzzing::id_canonicalisation` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::id_canonicalisation(data));
