#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weir_fuzz::http1_request_vs_hyper(data));
