//! `cellrate::fuzzing::grpc_framing` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::grpc_framing(data));
