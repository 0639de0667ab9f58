"""The service facade: every public name of ``MemoryService`` keeps its signature, whether
the class defines it or one of its parts (``svc.directory``, ``svc.notes_admin``,
``svc.api_keys``) provides it; a call added to a part is a call of the facade."""

from __future__ import annotations

import inspect
import pydoc

import pytest

from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.service import ApiKeys, Directory, MemoryService, NotesAdmin
from memory_pipelines.service.parts import Delegated, delegated_names, part

# every public name of MemoryService as users call it, with its signature (a property or a
# part: its kind); a name may be added here, never removed or changed
# fmt: off
PUBLIC_NAMES = {
    'add_agent_run': "(self, run_id: 'str', agent_id: 'str', user_id: 'str | None' = None, company_id: 'str | None' = None, conversation_id: 'str | None' = None, status: 'str' = 'Completed', success: 'bool | None' = True, error_message: 'str | None' = None, **fields: 'Any') -> 'None'",
    'add_company': "(self, company_id: 'str', name: 'str | None' = None) -> 'None'",
    'add_conversation': "(self, conversation_id: 'str', agent_id: 'str', user_id: 'str | None' = None, company_id: 'str | None' = None) -> 'None'",
    'add_example': "(self, agent_id: 'str', example_input: 'str', example_output: 'str', *, success_score: 'float | None' = None, user_id: 'str | None' = None, company_id: 'str | None' = None, status: 'str' = <ExampleStatus.ACTIVE: 'Active'>, **other_fields: 'Any') -> 'Example'",
    'add_message': "(self, conversation_id: 'str', message_id: 'str', role: 'str', text: 'str', rating: 'int | None' = None, rating_comment: 'str | None' = None, created_at: 'datetime | None' = None) -> 'None'",
    'add_note': "(self, note: 'str', *, type: 'str' = <NoteType.PREFERENCE: 'Preference'>, status: 'str' = <NoteStatus.ACTIVE: 'Active'>, author_type: 'str' = <AuthorType.USER: 'User'>, protection_tier: 'str' = <ProtectionTier.STANDARD: 'Standard'>, agent_id: 'str | None' = None, user_id: 'str | None' = None, company_id: 'str | None' = None, **other_fields: 'Any') -> 'Note'",
    'add_notes': "(self, notes: 'Sequence[Mapping[str, Any]]', *, key: 'Mapping[str, Any] | None' = None) -> 'list[Note]'",
    'api_keys': 'Part',
    'add_user': "(self, user_id: 'str', company_id: 'str | None' = None, name: 'str | None' = None) -> 'None'",
    'archive_note': "(self, note_id: 'str', *, key: 'Mapping[str, Any] | None' = None) -> 'Note'",
    'clock': 'property',
    'close': "(self) -> 'None'",
    'compact': "(self, run_id: 'str | None' = None) -> 'dict[str, Any]'",
    'configure_agent': "(self, agent_id: 'str', **fields: 'Any') -> 'AgentConfig'",
    'context': 'property',
    'create_api_key': "(self, *, company_id: 'str | None' = None, agent_id: 'str | None' = None, user_id: 'str | None' = None, admin: 'bool' = False, primary_scope: 'tuple[str, str] | None' = None, secondary_scopes: 'Mapping[str, Any] | None' = None, role: 'str | None' = None) -> 'str'",
    'directory': 'Part',
    'deactivate_agent': "(self, agent_id: 'str') -> 'None'",
    'delete_agent_run': "(self, run_id: 'str') -> 'None'",
    'delete_company': "(self, company_id: 'str') -> 'None'",
    'delete_conversation': "(self, conversation_id: 'str') -> 'None'",
    'delete_user': "(self, user_id: 'str') -> 'None'",
    'embed': "(self, texts: 'Sequence[str]') -> 'np.ndarray'",
    'erase_note': "(self, note_id: 'str', *, key: 'Mapping[str, Any] | None' = None, lease_wait_s: 'float | None' = None) -> 'dict[str, Any]'",
    'examples': "(self, **filters: 'Any') -> 'pd.DataFrame'",
    'explain': "(self, ctx: 'RunContext | Mapping[str, Any]', topic: 'str', current_input: 'str | None' = None, *, limit: 'int' = 10, all_agents: 'bool' = False, all_scopes: 'bool' = False, as_of: 'datetime | None' = None) -> 'Explanation'",
    'export_notes': "(self, path: 'str | os.PathLike[str]', *, agent_id: 'str | None' = None, user_id: 'str | None' = None, company_id: 'str | None' = None, include_vectors: 'bool' = True) -> 'int'",
    'format_write_feedback': "(self, results: 'Sequence[WriteResult]') -> 'str'",
    'from_env': "(home: 'str | Path | None' = None, **kwargs: 'Any') -> 'MemoryService'",
    'get_agent': "(self, agent_id: 'str') -> 'AgentConfig'",
    'get_example': "(self, example_id: 'str') -> 'Example | None'",
    'get_note': "(self, note_id: 'str') -> 'Note | None'",
    'history': "(self, note_id: 'str') -> 'list[NoteEvent]'",
    'import_notes': "(self, path: 'str | os.PathLike[str]') -> 'dict[str, int]'",
    'inject': "(self, ctx: 'RunContext | Mapping[str, Any]', current_input: 'str | None' = None, *, as_of: 'datetime | None' = None, record: 'bool' = True) -> 'Injection'",
    'judge': 'property',
    'list_agents': "(self) -> 'list[AgentConfig]'",
    'list_api_keys': "(self) -> 'list[dict[str, Any]]'",
    'list_notes': "(self, *, agent_id: 'str | None' = None, user_id: 'str | None' = None, company_id: 'str | None' = None, status: 'str | None' = None, q: 'str | None' = None, limit: 'int' = 50, cursor: 'str | None' = None, key: 'Mapping[str, Any] | None' = None) -> 'admin.NotePage'",
    'manager': 'property',
    'notes_admin': 'Part',
    'note': "(self, note_id: 'str', *, key: 'Mapping[str, Any] | None' = None) -> 'Note'",
    'notes': "(self, **filters: 'Any') -> 'pd.DataFrame'",
    'now': "(self) -> 'datetime'",
    'open': "(home: 'str | Path | None' = None, *, lance_uri: 'str | None' = None, sql_url: 'str | None' = None, embedder: 'Embedder | None' = None, llm: 'Any' = None, clock: 'Callable[[], datetime] | None' = None, write_config: 'WriteConfig | None' = None, inject_config: 'InjectConfig | None' = None, storage_options: 'dict[str, str] | None' = None, maintenance_config: 'MaintenanceConfig | None' = None) -> 'MemoryService'",
    'purge_user': "(self, user_id: 'str', *, lease_wait_s: 'float | None' = None) -> 'dict[str, Any]'",
    'remember': "(self, ctx: 'RunContext | Mapping[str, Any]', messages: 'Sequence[Any]') -> 'list[Note]'",
    'restore_note': "(self, note_id: 'str') -> 'Note'",
    'revoke_api_key': "(self, key_id: 'str') -> 'None'",
    'save_examples': "(self, examples: 'Sequence[Example]', vectors: 'np.ndarray | None' = None) -> 'list[Example]'",
    'save_notes': "(self, notes: 'Sequence[Note]', vectors: 'np.ndarray | None' = None, *, events: 'Sequence[NoteEvent]' = ()) -> 'list[Note]'",
    'set_note_status': "(self, note_id: 'str', status: 'str', comment: 'str | None' = None) -> 'Note'",
    'set_notes_status': "(self, note_ids: 'Sequence[str]', status: 'str', comment: 'str | None' = None, *, key: 'Mapping[str, Any] | None' = None) -> 'list[Note]'",
    'update_note': "(self, note_id: 'str', *, note: 'str | None' = None, type: 'str | None' = None, status: 'str | None' = None, protection_tier: 'str | None' = None, key: 'Mapping[str, Any] | None' = None) -> 'Note'",
    'update_notes': "(self, changes: 'Iterable[tuple[Note, Mapping[str, Any]]]') -> 'list[Note]'",
    'warm_up': "(self, *, background: 'bool' = False) -> 'threading.Thread | None'",
    'warm_scopes': "(self, scopes: 'int') -> 'int'",
    'write': "(self, ctx: 'RunContext | Mapping[str, Any]', writes: 'Sequence[Any]') -> 'list[WriteResult]'",
    'write_group': "(self, calls: 'Sequence[tuple[RunContext | Mapping[str, Any], Sequence[Any]]]') -> 'list[list[WriteResult] | Exception]'",
    'write_instructions': "(self, agent_id: 'str') -> 'str'",
}
# fmt: on


def _describe(name: str) -> str:
    static = inspect.getattr_static(MemoryService, name)
    if isinstance(static, property):
        return "property"
    if type(static).__name__ == "Part":
        return "Part"
    return str(inspect.signature(getattr(MemoryService, name)))


@pytest.mark.parametrize("name", sorted(PUBLIC_NAMES))
def test_every_public_name_keeps_its_signature(name):
    assert _describe(name) == PUBLIC_NAMES[name]


def test_the_facade_has_no_public_name_the_table_does_not_know():
    public = {n for n in dir(MemoryService) if not n.startswith("_")}
    assert public == set(PUBLIC_NAMES)


def test_each_part_provides_its_calls_once():
    names = delegated_names(MemoryService)
    for via, cls in (("directory", Directory), ("notes_admin", NotesAdmin), ("api_keys", ApiKeys)):
        provided = {
            n for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")
        }
        assert provided and {n for n, v in names.items() if v == via} == provided
        for n in provided:  # the class shows the part's function: help() and signatures
            assert getattr(MemoryService, n).__wrapped__ is vars(cls)[n]
    assert {"configure_agent", "list_notes", "create_api_key", "add_note", "purge_user"} <= set(
        names
    )
    assert (
        "write" not in names and "inject" not in names
    )  # the agent-facing calls stay on the class


def test_a_facade_name_is_the_parts_bound_method(tmp_path, clock):
    with MemoryService.open(tmp_path / "home", embedder=HashEmbedder(dim=16), clock=clock) as svc:
        assert isinstance(svc.directory, Directory) and svc.directory is svc.directory
        assert svc.configure_agent.__self__ is svc.directory
        assert svc.add_note.__self__ is svc.notes_admin
        assert svc.list_api_keys.__self__ is svc.api_keys
        assert str(inspect.signature(svc.add_user)) == str(
            inspect.signature(svc.directory.add_user)
        )
        # the two spellings are one call
        svc.directory.configure_agent("a", max_notes_to_inject=7)
        assert svc.get_agent("a").max_notes_to_inject == 7
        # called through the class with the service as self, as a method defined there
        MemoryService.add_company(svc, "co-1", "Company One")
        assert MemoryService.get_agent(svc, "a").max_notes_to_inject == 7
        note = svc.add_note("prefers tea", agent_id="a", user_id="u")
        assert svc.notes_admin.note(note.id).note == "prefers tea"
        assert [e.event for e in svc.history(note.id)] == [
            e.event for e in svc.notes_admin.history(note.id)
        ]
        secret = svc.create_api_key(admin=True)
        assert secret and len(svc.api_keys.list_api_keys()) == 1


def test_help_shows_each_facade_name_with_its_docstring():
    text = pydoc.render_doc(MemoryService, renderer=pydoc.plaintext)
    for name in ("configure_agent", "list_notes", "create_api_key", "restore_note"):
        assert f"{name}(self" in text, name
    assert inspect.getdoc(MemoryService.restore_note).split()[:3] == ["Undo", "the", "decision"]
    assert MemoryService.__dict__["list_notes"].__doc__ == NotesAdmin.list_notes.__doc__
    assert isinstance(MemoryService.__dict__["list_notes"], Delegated)


def test_a_method_added_to_a_part_is_a_name_of_the_facade():
    class Greetings:
        def __init__(self, service):
            self.service = service

        def greet(self, who: str, *, loud: bool = False) -> str:
            """Say hello."""
            text = f"hello {who} from {self.service.name}"
            return text.upper() if loud else text

    class Facade:
        greetings = part(Greetings)

        def __init__(self):
            self.name = "facade"

    facade = Facade()
    assert facade.greet("ann", loud=True) == "HELLO ANN FROM FACADE"
    assert (
        str(inspect.signature(Facade.greet))
        == "(self, who: 'str', *, loud: 'bool' = False) -> 'str'"
    )
    assert Facade.greet.__doc__ == "Say hello."


def test_a_part_may_not_shadow_a_name_the_facade_defines():
    class Clash:
        def __init__(self, service):
            pass

        def close(self) -> None:
            pass

    # Python 3.11 wraps an error of __set_name__ in a RuntimeError; later versions do not
    with pytest.raises((TypeError, RuntimeError)) as info:

        class Facade:
            def close(self) -> None:
                pass

            clash = part(Clash)

    error = info.value.__cause__ or info.value
    assert isinstance(error, TypeError) and "Facade.close is already defined" in str(error)
