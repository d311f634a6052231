// Package config loads a binary's typed configuration: defaults, then an
// optional TOML file (--config), then flags, then validation. Unknown keys
// in the file are an error that names them (a key spelled in another case
// too: the TOML decoder would take it), and so is a duration given as
// a bare number (`linger = 5`, which the TOML decoder would read as 5 ns)
// instead of a string with a unit ("5ms"), and a negative number for an
// unsigned key (which it would wrap). --config is given at most once.
// Secret holds a password or
// token read from a file or an environment variable (ReadSecret) and never
// prints it.
//
// One naming everywhere: a key is named by its TOML path
// ("store.batch_records"); its flag is that path with "-" for "_"
// ("--store.batch-records"); validation errors start with the TOML path.
// FlagName does the conversion, Prefix registers a component's flags under
// its section, and CheckFlags (for tests) finds the flags that name no key.
package config

import (
	"flag"
	"fmt"
	"io"
	"iter"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Option changes how Load reads a config.
type Option func(*options)

type options struct {
	moved  map[string]string
	noArgs bool
	unused map[string]string
}

// Moved names keys that are no longer keys, each with what to set instead;
// the unknown-key error of a file that still has one says so
// ("gateway.tls: no longer a key: TLS is on by default; ...").
func Moved(keys map[string]string) Option {
	return func(o *options) { o.moved = keys }
}

// NoArgs makes a word left over after the flags an error. The flag parser
// stops at the first word that is not a flag, so without it every flag
// after a stray word (`--x false`: a true/false flag takes no separate
// value) would be dropped without a word.
func NoArgs() Option {
	return func(o *options) { o.noArgs = true }
}

// Unused names keys (TOML paths) that the command reads from the config but
// does not use, each with why; setting one, or a key under it, in the
// --config file or by its flag is an error naming it
// ("clickhouse.addr: not used by faultline dev: ...").
func Unused(keys map[string]string) Option {
	return func(o *options) { o.unused = keys }
}

// unusedKey returns the entry of unused that key is, or is under.
func unusedKey(unused map[string]string, key string) (string, string, bool) {
	for k, why := range unused {
		if key == k || strings.HasPrefix(key, k+".") {
			return k, why, true
		}
	}
	return "", "", false
}

// Load fills cfg (a pointer to the config holding its defaults) from the
// --config file named in args, then from the flags that register adds, then
// runs validate. It returns the remaining positional arguments. Errors and
// --help go to out; --help lists every flag but the deprecated spellings
// (Alias), and a deprecated spelling that is used is named on out with its
// current name.
func Load(name string, args []string, cfg any, register func(fs *flag.FlagSet), validate func() error, out io.Writer, opts ...Option) ([]string, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	path, err := configPath(args)
	if err != nil {
		return nil, err
	}
	if path != "" {
		// Read once: both decodes below see the same file.
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		md, err := toml.Decode(string(b), cfg)
		if err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = k.String()
				if why, ok := o.moved[keys[i]]; ok {
					return nil, fmt.Errorf("config file %s: %s: no longer a key: %s", path, keys[i], why)
				}
			}
			return nil, fmt.Errorf("config file %s: unknown keys: %s", path, strings.Join(keys, ", "))
		}
		var raw map[string]any
		if _, err := toml.Decode(string(b), &raw); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		if err := checkValues(raw, reflect.TypeOf(cfg), ""); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		for _, k := range md.Keys() {
			if key, why, ok := unusedKey(o.unused, k.String()); ok {
				return nil, fmt.Errorf("config file %s: %s: not used by %s: %s", path, key, name, why)
			}
		}
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.String("config", "", "TOML configuration file (flags override it)")
	register(fs)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage of %s:\n", name)
		PrintDefaults(fs, out)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.noArgs && fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: flags after it would be ignored (write a true/false flag as --flag=false)", fs.Arg(0))
	}
	var unusedErr error
	fs.Visit(func(f *flag.Flag) {
		current := f.Name
		if d, ok := f.Value.(*deprecated); ok {
			fmt.Fprintf(out, "%s: flag --%s is deprecated; use --%s\n", name, f.Name, d.name)
			current = d.name
		}
		for k, why := range o.unused {
			if fk := FlagName(k); unusedErr == nil && (current == fk || strings.HasPrefix(current, fk+".")) {
				unusedErr = fmt.Errorf("%s (--%s): not used by %s: %s", k, f.Name, name, why)
			}
		}
	})
	if unusedErr != nil {
		return nil, unusedErr
	}
	if err := validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return fs.Args(), nil
}

// configPath finds --config/-config in args without parsing the rest. A
// second one is an error: the file is read from this one, while the flag
// parser would keep the last, so one of the two would be ignored.
func configPath(args []string) (string, error) {
	var paths []string
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, p := range []string{"--config", "-config"} {
			if a == p && i+1 < len(args) {
				paths = append(paths, args[i+1])
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				paths = append(paths, v)
			}
		}
	}
	switch len(paths) {
	case 0:
		return "", nil
	case 1:
		return paths[0], nil
	}
	return "", fmt.Errorf("--config given twice: %s and %s", paths[0], paths[1])
}

// FlagName is the flag of a TOML key path: "store.batch_records" →
// "store.batch-records".
func FlagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// Prefix registers the flags register adds under prefix ("gateway."), for
// components whose RegisterFlags takes no prefix, and keeps each flag's
// unprefixed name as a deprecated spelling (Alias).
func Prefix(fs *flag.FlagSet, prefix string, register func(fs *flag.FlagSet)) {
	tmp := flag.NewFlagSet("", flag.ContinueOnError)
	register(tmp)
	tmp.VisitAll(func(f *flag.Flag) {
		fs.Var(f.Value, prefix+f.Name, f.Usage)
		Alias(fs, f.Name, prefix+f.Name)
	})
}

// Alias makes old a deprecated spelling of the flag current (registered
// already): setting it sets current, Load names the current spelling when
// it is used, and --help does not list it.
func Alias(fs *flag.FlagSet, old, current string) {
	f := fs.Lookup(current)
	if f == nil || fs.Lookup(old) != nil {
		return
	}
	fs.Var(&deprecated{Value: f.Value, name: current}, old, "deprecated: use --"+current)
}

// deprecated is the Value of a deprecated flag spelling.
type deprecated struct {
	flag.Value
	name string // the current spelling
}

// IsBoolFlag keeps --old (no value) working for a boolean flag.
func (d *deprecated) IsBoolFlag() bool {
	b, ok := d.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// PrintDefaults writes the flags of fs as flag.PrintDefaults does, leaving
// out the deprecated spellings.
func PrintDefaults(fs *flag.FlagSet, out io.Writer) {
	shown := flag.NewFlagSet("", flag.ContinueOnError)
	shown.SetOutput(out)
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(*deprecated); !ok {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

// Keys returns the TOML key paths of a config struct (cfg or a pointer to
// it): every field with a toml tag, tables and their fields alike, in the
// order of the struct; an embedded struct's keys are its parent's.
func Keys(cfg any) []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for key, ft := range fields(t) {
			out = append(out, prefix+key)
			walk(ft, prefix+key+".")
		}
	}
	walk(reflect.TypeOf(cfg), "")
	return out
}

// fields yields the keys of the TOML table that t (a struct, or a pointer
// to or slice of one) decodes, each with its field's type, in the order of
// the struct: every exported field with a toml tag other than "-", and an
// untagged embedded struct's keys as t's own. Any other t has none.
func fields(t reflect.Type) iter.Seq2[string, reflect.Type] {
	return func(yield func(string, reflect.Type) bool) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			switch {
			case tag == "-" || !f.IsExported():
			case f.Anonymous && tag == "":
				for key, ft := range fields(f.Type) {
					if !yield(key, ft) {
						return
					}
				}
			case tag != "":
				if !yield(tag, f.Type) {
					return
				}
			}
		}
	}
}

// CheckFlags returns an error naming every flag of fs that names no key of
// cfg (FlagName of a Keys path), other than --config, the deprecated
// spellings and the flags listed in exempt (command arguments that are not
// configuration, such as --list).
func CheckFlags(fs *flag.FlagSet, cfg any, exempt ...string) error {
	keys := map[string]bool{}
	for _, k := range Keys(cfg) {
		keys[FlagName(k)] = true
	}
	var bad []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, dep := f.Value.(*deprecated); dep || f.Name == "config" || slices.Contains(exempt, f.Name) {
			return
		}
		if !keys[f.Name] {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("flags that name no TOML key: %s", strings.Join(bad, ", "))
	}
	return nil
}
