package nvsentinel

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// contract is a package's wire contract: every service, message and enum
// with its members, in the format of testdata/datamodels.txt.
type contract struct {
	blocks map[string]*block // "message HealthEvent" -> members
	order  []string
}

type block struct {
	members map[string]member // field or value name, or rpc name -> member
	order   []string
}

// member is one line of a block: its number (field, enum value) and the
// rest of its description (field type, rpc signature).
type member struct {
	number int
	desc   string
}

func (m member) String(name string) string {
	if m.number < 0 {
		return name + m.desc
	}
	if m.desc == "" {
		return fmt.Sprintf("%s = %d", name, m.number)
	}
	return fmt.Sprintf("%s = %d %s", name, m.number, m.desc)
}

func (c *contract) add(kind, name string) *block {
	key := kind + " " + name
	if c.blocks == nil {
		c.blocks = map[string]*block{}
	}
	if b, ok := c.blocks[key]; ok {
		return b
	}
	b := &block{members: map[string]member{}}
	c.blocks[key] = b
	c.order = append(c.order, key)
	return b
}

func (b *block) add(name string, m member) {
	if _, ok := b.members[name]; !ok {
		b.order = append(b.order, name)
	}
	b.members[name] = m
}

// parseContract reads the snapshot format (see testdata/datamodels.txt).
func parseContract(path string) (*contract, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &contract{}
	var cur *block
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		bad := func(why string) error { return fmt.Errorf("%s:%d: %s: %q", path, n, why, line) }
		if !strings.HasPrefix(line, " ") {
			kind, name, ok := strings.Cut(trimmed, " ")
			if !ok || !slices.Contains([]string{"message", "enum", "service"}, kind) {
				return nil, bad("want message, enum or service NAME")
			}
			cur = c.add(kind, name)
			continue
		}
		if cur == nil {
			return nil, bad("member outside a block")
		}
		if i := strings.IndexByte(trimmed, '('); i > 0 && !strings.Contains(trimmed, "=") {
			cur.add(trimmed[:i], member{number: -1, desc: trimmed[i:]})
			continue
		}
		name, rest, ok := strings.Cut(trimmed, " = ")
		if !ok {
			return nil, bad("want NAME = NUMBER [TYPE]")
		}
		num, desc, _ := strings.Cut(rest, " ")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, bad("bad number")
		}
		cur.add(name, member{number: v, desc: desc})
	}
	return c, sc.Err()
}

// describe renders faultline's generated descriptors of package datamodels
// in the same format: names, numbers, labels, types, enum values, rpcs.
func describe(files ...protoreflect.FileDescriptor) *contract {
	c := &contract{}
	for _, fd := range files {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			b := c.add("service", string(sd.Name()))
			for j := range sd.Methods().Len() {
				m := sd.Methods().Get(j)
				b.add(string(m.Name()), member{number: -1, desc: fmt.Sprintf("(%s) %s", typeName(m.Input().FullName()), typeName(m.Output().FullName()))})
			}
		}
		for i := range fd.Enums().Len() {
			describeEnum(c, fd.Enums().Get(i))
		}
		for i := range fd.Messages().Len() {
			describeMessage(c, fd.Messages().Get(i))
		}
	}
	return c
}

func describeEnum(c *contract, ed protoreflect.EnumDescriptor) {
	b := c.add("enum", string(ed.Name()))
	for j := range ed.Values().Len() {
		v := ed.Values().Get(j)
		b.add(string(v.Name()), member{number: int(v.Number())})
	}
}

func describeMessage(c *contract, md protoreflect.MessageDescriptor) {
	if md.IsMapEntry() {
		return
	}
	b := c.add("message", string(md.Name()))
	for j := range md.Fields().Len() {
		f := md.Fields().Get(j)
		b.add(string(f.Name()), member{number: int(f.Number()), desc: fieldType(f)})
	}
	for j := range md.Enums().Len() {
		describeEnum(c, md.Enums().Get(j))
	}
	for j := range md.Messages().Len() {
		describeMessage(c, md.Messages().Get(j))
	}
}

func fieldType(f protoreflect.FieldDescriptor) string {
	if f.IsMap() {
		return fmt.Sprintf("map<%s, %s>", kindName(f.MapKey()), kindName(f.MapValue()))
	}
	if f.IsList() {
		return "repeated " + kindName(f)
	}
	return kindName(f)
}

func kindName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return typeName(f.Message().FullName())
	case protoreflect.EnumKind:
		return typeName(f.Enum().FullName())
	}
	return f.Kind().String()
}

func typeName(n protoreflect.FullName) string {
	return strings.TrimPrefix(string(n), "datamodels.")
}

// drift lists how faultline's contract departs from NVSentinel's: every
// NVSentinel service, rpc, message, field and enum value must be in
// faultline's with the same number and type; faultline may add messages,
// enums, and fields numbered from 100 up to NVSentinel's messages, but no
// value to NVSentinel's enums and no rpc to its services (a value or rpc
// NVSentinel later defines differently would break its monitors).
func drift(nv, fl *contract) []string {
	var out []string
	for _, key := range nv.order {
		nb := nv.blocks[key]
		fb := fl.blocks[key]
		if fb == nil {
			out = append(out, key+": missing from faultline")
			continue
		}
		for _, name := range nb.order {
			want := nb.members[name].String(name)
			got, ok := fb.members[name]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s: %s: missing from faultline", key, want))
			case got.String(name) != want:
				out = append(out, fmt.Sprintf("%s: faultline has %s, NVSentinel %s", key, got.String(name), want))
			}
		}
		numbers := map[int]string{}
		for _, name := range nb.order {
			if m := nb.members[name]; m.number >= 0 {
				numbers[m.number] = name
			}
		}
		kind, _, _ := strings.Cut(key, " ")
		for _, name := range fb.order {
			if _, ok := nb.members[name]; ok {
				continue
			}
			m := fb.members[name]
			switch {
			case kind != "message":
				out = append(out, fmt.Sprintf("%s: faultline adds %s: NVSentinel's %ss are not extended", key, m.String(name), kind))
			case numbers[m.number] != "":
				out = append(out, fmt.Sprintf("%s: faultline's %s takes NVSentinel's number of %s", key, m.String(name), numbers[m.number]))
			case m.number < 100:
				out = append(out, fmt.Sprintf("%s: faultline's %s: additions are numbered from 100", key, m.String(name)))
			}
		}
	}
	return out
}

// TestMatchesNVSentinel holds faultline's datamodels package to the
// checked-in snapshot of NVSentinel's (testdata/datamodels.txt).
func TestMatchesNVSentinel(t *testing.T) {
	nv, err := parseContract("testdata/datamodels.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(nv.blocks) < 10 {
		t.Fatalf("snapshot has %d blocks; it did not parse as meant", len(nv.blocks))
	}
	fl := describe(datamodels.File_datamodels_health_event_proto, datamodels.File_datamodels_external_remediation_proto)
	for _, d := range drift(nv, fl) {
		t.Error(d)
	}
	// The snapshot names every NVSentinel field this test compared.
	fields := 0
	for _, b := range nv.blocks {
		fields += len(b.members)
	}
	t.Logf("compared %d services, messages and enums, %d members", len(nv.blocks), fields)
}

// TestDriftIsCaught: the comparison fails on each kind of drift.
func TestDriftIsCaught(t *testing.T) {
	nv, err := parseContract("testdata/datamodels.txt")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(fl *contract)
		want   string
	}{
		{"renumbered field", func(fl *contract) {
			fl.blocks["message HealthEvent"].add("nodeName", member{number: 19, desc: "string"})
		}, "message HealthEvent: faultline has nodeName = 19 string, NVSentinel nodeName = 13 string"},
		{"retyped field", func(fl *contract) {
			fl.blocks["message HealthEvent"].add("isFatal", member{number: 5, desc: "uint32"})
		}, "faultline has isFatal = 5 uint32"},
		{"repeated lost", func(fl *contract) {
			fl.blocks["message HealthEvent"].add("errorCode", member{number: 9, desc: "string"})
		}, "faultline has errorCode = 9 string"},
		{"field missing", func(fl *contract) {
			b := fl.blocks["message HealthEvent"]
			delete(b.members, "customRecommendedAction")
		}, "customRecommendedAction = 18 string: missing from faultline"},
		{"enum value missing", func(fl *contract) {
			delete(fl.blocks["enum ProcessingStrategy"].members, "STORE_AND_ANALYSE")
		}, "STORE_AND_ANALYSE = 3: missing from faultline"},
		{"enum value renumbered", func(fl *contract) {
			fl.blocks["enum RecommendedAction"].add("CUSTOM", member{number: 28})
		}, "faultline has CUSTOM = 28, NVSentinel CUSTOM = 27"},
		{"enum value added", func(fl *contract) {
			fl.blocks["enum RecommendedAction"].add("RESTART_APP", member{number: 39})
		}, "faultline adds RESTART_APP = 39"},
		{"addition below 100", func(fl *contract) {
			fl.blocks["message HealthEvent"].add("cluster", member{number: 19, desc: "string"})
		}, "additions are numbered from 100"},
		{"addition on a taken number", func(fl *contract) {
			fl.blocks["message Entity"].add("entityKind", member{number: 2, desc: "string"})
		}, "takes NVSentinel's number of entityValue"},
		{"message missing", func(fl *contract) {
			delete(fl.blocks, "message BehaviourOverrides")
		}, "message BehaviourOverrides: missing from faultline"},
		{"rpc changed", func(fl *contract) {
			fl.blocks["service PlatformConnector"].add("HealthEventOccurredV1", member{number: -1, desc: "(HealthEvent) google.protobuf.Empty"})
		}, "faultline has HealthEventOccurredV1(HealthEvent)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fl := describe(datamodels.File_datamodels_health_event_proto, datamodels.File_datamodels_external_remediation_proto)
			if d := drift(nv, fl); len(d) != 0 {
				t.Fatalf("faultline drifts already: %v", d)
			}
			tt.mutate(fl)
			d := drift(nv, fl)
			if len(d) != 1 || !strings.Contains(d[0], tt.want) {
				t.Fatalf("drift %q, want one naming %q", d, tt.want)
			}
		})
	}
	// faultline's own additions are allowed: fields from 100 and its
	// own messages.
	fl := describe(datamodels.File_datamodels_health_event_proto, datamodels.File_datamodels_external_remediation_proto)
	if fl.blocks["message HealthEvent"].members["cluster"].number != 101 || fl.blocks["message Submitter"] == nil {
		t.Fatal("faultline's additions are not where this test expects them")
	}
}
