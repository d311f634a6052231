package events

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// BoundKey returns a stand-in for s that is at most n bytes (n ≥ 32) and
// costs no more than that in JSON, for client strings kept in size-limited
// places (node annotations): s itself when it fits and has no character
// that JSON escapes; otherwise a readable prefix (such characters replaced
// by '?') followed by "#" and 16 hex digits of the SHA-256 of the whole of
// s. Equal inputs give equal stand-ins and different inputs, in practice,
// different ones, so a stand-in still identifies the value (a fault's
// entities, its check).
func BoundKey(s string, n int) string {
	if n < 32 {
		n = 32
	}
	if len(s) <= n && jsonPlain(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	tag := "#" + hex.EncodeToString(sum[:8])
	var b strings.Builder
	for _, r := range s {
		if b.Len()+utf8.RuneLen(r)+len(tag) > n {
			break
		}
		if !jsonPlainRune(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String() + tag
}

// IsBoundKey reports whether k is a BoundKey stand-in that differs from
// its input (ends in "#" and 16 hex digits and was cut or cleaned).
func IsBoundKey(k string) bool {
	i := len(k) - 17
	if i < 0 || k[i] != '#' {
		return false
	}
	_, err := hex.DecodeString(k[i+1:])
	return err == nil
}

// jsonPlain reports whether encoding/json writes s as it is.
func jsonPlain(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !jsonPlainRune(r) {
			return false
		}
	}
	return true
}

func jsonPlainRune(r rune) bool {
	switch {
	case r < 0x20, r == '"', r == '\\', r == '<', r == '>', r == '&', r == 0x2028, r == 0x2029, r == utf8.RuneError:
		return false
	}
	return true
}
