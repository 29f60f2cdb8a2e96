// weir browser challenge, served as /.weir/challenge.js (docs/challenge.md).
// Finds the smallest counter such that SHA-256(nonce + ":" + counter) starts
// with `bits` zero bits, then submits it. Uses WebCrypto when the page is a
// secure context (HTTPS or localhost), and a small pure-JS SHA-256 otherwise
// (crypto.subtle does not exist on plain-HTTP pages).
(function () {
  'use strict';
  var root = document.getElementById('weir-challenge');
  var status = document.getElementById('weir-status');
  var form = document.getElementById('weir-form');
  if (!root || !status || !form) return;
  var nonce = form.elements.nonce.value;
  var bits = parseInt(root.getAttribute('data-bits'), 10);

  function say(key) {
    status.textContent = root.getAttribute('data-text-' + key) || '';
  }
  function stop(key) {
    root.classList.remove('working');
    root.removeAttribute('aria-busy');
    say(key);
  }
  if (!(bits >= 0 && bits <= 28) || !nonce) { stop('failed'); return; }
  // A browser too old for the work (no TextEncoder, Promise or
  // MessageChannel: an old phone's) takes the way a browser without
  // JavaScript takes: the refresh, which weir holds for its delay.
  if (!(window.TextEncoder && window.Promise && window.MessageChannel && Math.clz32)) {
    var refresh = root.getAttribute('data-refresh');
    if (refresh) { say('working'); window.location.replace(refresh); } else { stop('failed'); }
    return;
  }
  root.classList.add('working');
  root.setAttribute('aria-busy', 'true');
  // Without cookies the pass comes in the address of the page it opens, for
  // that page only: say so, and do the work all the same.
  say(navigator.cookieEnabled ? 'working' : 'cookies');

  var encoder = new TextEncoder();
  var subtle = window.isSecureContext && window.crypto && window.crypto.subtle;
  // WebCrypto: a batch of digests in flight at once amortises the promise
  // round trip; each batch ends in a task, so the page stays responsive.
  // Pure JS: smaller batches, since each one blocks the main thread.
  var BATCH = subtle ? 512 : 2048;

  function zeroBits(bytes) {
    var n = 0;
    for (var i = 0; i < bytes.length; i++) {
      if (bytes[i] === 0) { n += 8; continue; }
      return n + Math.clz32(bytes[i]) - 24;
    }
    return n;
  }

  function batch(start) {
    var jobs = new Array(BATCH);
    for (var i = 0; i < BATCH; i++) {
      var data = encoder.encode(nonce + ':' + (start + i));
      jobs[i] = subtle ? subtle.digest('SHA-256', data) : sha256(data);
    }
    return subtle ? Promise.all(jobs) : Promise.resolve(jobs);
  }

  // Yields to the event loop without setTimeout, which background tabs
  // throttle to once a second.
  var channel = new MessageChannel();
  var resume = null;
  channel.port1.onmessage = function () { var r = resume; resume = null; if (r) r(); };
  function yieldNow() {
    return new Promise(function (r) { resume = r; channel.port2.postMessage(0); });
  }

  function search(start) {
    return batch(start).then(function (hashes) {
      for (var i = 0; i < hashes.length; i++) {
        if (zeroBits(new Uint8Array(hashes[i])) >= bits) return start + i;
      }
      return yieldNow().then(function () { return search(start + BATCH); });
    });
  }

  // FIPS 180-4 SHA-256 of a Uint8Array, for pages without WebCrypto.
  var K = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
  ]);
  var W = new Uint32Array(64);
  function sha256(msg) {
    var len = msg.length;
    var words = ((len + 8) >> 6 << 4) + 16;
    var m = new Uint32Array(words);
    for (var i = 0; i < len; i++) m[i >> 2] |= msg[i] << (24 - (i & 3) * 8);
    m[len >> 2] |= 0x80 << (24 - (len & 3) * 8);
    m[words - 1] = len * 8;
    var h0 = 0x6a09e667, h1 = 0xbb67ae85, h2 = 0x3c6ef372, h3 = 0xa54ff53a;
    var h4 = 0x510e527f, h5 = 0x9b05688c, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
    for (var off = 0; off < words; off += 16) {
      for (var t = 0; t < 16; t++) W[t] = m[off + t];
      for (t = 16; t < 64; t++) {
        var x = W[t - 15], y = W[t - 2];
        var s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
        var s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
        W[t] = W[t - 16] + s0 + W[t - 7] + s1;
      }
      var a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, k = h7;
      for (t = 0; t < 64; t++) {
        var S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
        var t1 = (k + S1 + ((e & f) ^ (~e & g)) + K[t] + W[t]) | 0;
        var S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
        var t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
      }
      h0 = (h0 + a) | 0; h1 = (h1 + b) | 0; h2 = (h2 + c) | 0; h3 = (h3 + d) | 0;
      h4 = (h4 + e) | 0; h5 = (h5 + f) | 0; h6 = (h6 + g) | 0; h7 = (h7 + k) | 0;
    }
    var out = new Uint8Array(32);
    var hs = [h0, h1, h2, h3, h4, h5, h6, h7];
    for (i = 0; i < 8; i++) {
      out[i * 4] = hs[i] >>> 24; out[i * 4 + 1] = hs[i] >>> 16;
      out[i * 4 + 2] = hs[i] >>> 8; out[i * 4 + 3] = hs[i];
    }
    return out;
  }
  search(0).then(function (counter) {
    form.elements.counter.value = String(counter);
    stop('done');
    form.submit();
  }, function () { stop('failed'); });
})();
