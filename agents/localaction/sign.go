package localaction

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// The janitor signs every request with an Ed25519 key only it holds; the
// agent holds the public key. The signature covers the method, the path
// and the exact body, and the body names the node, the request id, the
// action and when it was issued: a request signed for one node is refused
// by every other (the agent knows its node), and an old one is refused
// once it is outside max_clock_skew. Nothing a node holds lets it act on
// another node (the bearer token this replaced was the same on every
// node).
//
// Keys are PEM, as OpenSSL writes them:
//
//	openssl genpkey -algorithm ed25519 -out local-actions.key        # PRIVATE KEY (PKCS #8), the janitor's
//	openssl pkey -in local-actions.key -pubout -out local-actions.pub # PUBLIC KEY (PKIX), the agents'

// AuthScheme is the Authorization scheme of a signed request:
// "Authorization: Faultline-Ed25519 <base64 signature>".
const AuthScheme = "Faultline-Ed25519"

// signedPrefix starts the signed bytes (a domain separator: a signature
// made for anything else never verifies here).
const signedPrefix = "faultline-local-action-v1\n"

// SignedBytes are the bytes a request's signature covers.
func SignedBytes(method, path string, body []byte) []byte {
	b := make([]byte, 0, len(signedPrefix)+len(method)+len(path)+2+len(body))
	b = append(b, signedPrefix...)
	b = append(b, method...)
	b = append(b, '\n')
	b = append(b, path...)
	b = append(b, '\n')
	return append(b, body...)
}

// Sign returns the Authorization header value of a request.
func Sign(key ed25519.PrivateKey, method, path string, body []byte) string {
	return AuthScheme + " " + base64.StdEncoding.EncodeToString(ed25519.Sign(key, SignedBytes(method, path, body)))
}

// errUnsigned is a request without a signature (a bearer token, nothing).
var errUnsigned = errors.New("not a signed request: want Authorization: " + AuthScheme + " <signature> (the janitor's local.signing_key_file)")

// verify checks the Authorization header against keys.
func verify(keys []ed25519.PublicKey, auth, method, path string, body []byte) error {
	sig, ok := strings.CutPrefix(auth, AuthScheme+" ")
	if !ok {
		return errUnsigned
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sig))
	if err != nil || len(raw) != ed25519.SignatureSize {
		return errors.New("signature: not a base64 Ed25519 signature")
	}
	msg := SignedBytes(method, path, body)
	for _, k := range keys {
		if ed25519.Verify(k, msg, raw) {
			return nil
		}
	}
	return errors.New("signature: made by no key of local_actions.verify_key_file, or over another method, path or body")
}

// LoadSigningKey reads the janitor's Ed25519 private key: one PEM "PRIVATE
// KEY" block (PKCS #8, `openssl genpkey -algorithm ed25519`). A file every
// user on the machine may read or change is refused.
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	b, err := readKeyFile(path, true)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: want a PEM PRIVATE KEY block (openssl genpkey -algorithm ed25519)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T, want an Ed25519 key", path, k)
	}
	return ek, nil
}

// LoadVerifyKeys reads the agent's Ed25519 public keys: one or more PEM
// "PUBLIC KEY" blocks (PKIX, `openssl pkey -pubout`). More than one lets
// the janitor's key be rotated: add the new public key, switch the
// janitor, remove the old one.
func LoadVerifyKeys(path string) ([]ed25519.PublicKey, error) {
	b, err := readKeyFile(path, false)
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PublicKey
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("%s: a PEM %s block, want PUBLIC KEY (openssl pkey -pubout); never give agents the private key", path, blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		ek, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s: a %T, want an Ed25519 key", path, k)
		}
		keys = append(keys, ek)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no PEM PUBLIC KEY block", path)
	}
	return keys, nil
}

func readKeyFile(path string, private bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if private {
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if perm := st.Mode().Perm(); perm&0o007 != 0 {
			return nil, fmt.Errorf("%s has mode %#o, open to every user on the machine: chmod 0600 it "+
				"(or 0640 for a group), or mount the Kubernetes Secret with defaultMode: 0440", path, fs.FileMode(perm))
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}
