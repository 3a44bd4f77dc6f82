import { render } from 'preact';
import { App } from './app';
import { installShellHooks } from './shell';
import { applyTheme } from './theme';
import './style.css';

installShellHooks();
// The system's appearance until the engine says which theme Settings chose (App applies it then).
applyTheme('system');
render(<App />, document.getElementById('app')!);
